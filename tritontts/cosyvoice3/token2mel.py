"""CosyVoice3's `token2wav`: speech tokens → mel with the DiT flow, stateless, as upstream's Triton model.

Each call runs the flow over the prompt and every target token given (streaming attention unless `finalize`;
without `finalize` the last 3 tokens are look-ahead only) and returns the mel from `token_offset * 2` on.
`run_many` decodes the calls of one Triton batch together (CosyVoice2's `Flow.inference_many`: batched and, on
CUDA with graphs captured, replayed from CUDA graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, SPK2INFO_FILE, CachedSpeaker, load_spk2info
from tritontts.cosyvoice2.token2wav import flow_request
from tritontts.cosyvoice3.flow import Flow3, load_flow3
from tritontts.cosyvoice3.wire import Token2MelCall
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig
from tritontts.devices import mark_on_device
from tritontts.stage_timer import StageTimer


class Token2Mel:
    def __init__(self, flow: Flow3, default: CachedSpeaker | None = None) -> None:
        self.flow = flow
        self.default = default
        self.device = flow.spk_embed_affine_layer.weight.device
        self.graphs: CaptureReport | None = None

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        flow_graphs: FlowGraphConfig | None = None,
    ) -> Token2Mel:
        """`cosyvoice3.yaml` + `flow.pt`; spk2info.pt's speaker "001" (or its first) when the file exists."""
        model_dir = Path(model_dir)
        model = cls(
            load_flow3(model_dir, device=device, dtype=dtype), _default_speaker(model_dir / SPK2INFO_FILE)
        )
        if flow_graphs is not None:
            model.graphs = model.flow.use_cuda_graphs(flow_graphs)
        return model

    def run_many(
        self, calls: Sequence[Token2MelCall], timer: StageTimer | None = None
    ) -> list[Tensor | ValueError]:
        """Each call's mel `[80, T]` fp32 (or its ValueError), the flows decoded together."""
        dtype = self.flow.spk_embed_affine_layer.weight.dtype
        requests = [
            flow_request(
                c.target,
                c.prompt_tokens,
                c.prompt_feat,
                c.embedding,
                not c.finalize,
                c.finalize,
                self.device,
                dtype,
            )
            for c in calls
        ]
        with torch.inference_mode():
            mels = self.flow.inference_many(requests)
        mark_on_device(timer, "flow", self.device)
        out: list[Tensor | ValueError] = []
        for call, mel in zip(calls, mels):
            if isinstance(mel, ValueError):
                out.append(mel)
                continue
            start = 0 if call.token_offset is None else call.token_offset * self.flow.token_mel_ratio
            out.append(mel[0, :, start:].float())
        return out


def _default_speaker(path: Path) -> CachedSpeaker | None:
    if not path.exists():
        return None
    speakers = load_spk2info(path)
    return speakers.get(DEFAULT_SPEAKER) or next(iter(speakers.values()))
