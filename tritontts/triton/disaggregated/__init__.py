"""Disaggregated serving: the LLM behind an OpenAI-compatible server on its own GPUs, token2wav tritonservers
(whose BLS reaches that server through `llm_endpoint`) on the others, several per GPU."""

from tritontts.triton.disaggregated.launcher import LaunchError, start, status, stop_all
from tritontts.triton.disaggregated.plan import LLMServerPlan, PlanError, PortBases, Topology

__all__ = [
    "LLMServerPlan",
    "LaunchError",
    "PlanError",
    "PortBases",
    "Topology",
    "start",
    "status",
    "stop_all",
]
