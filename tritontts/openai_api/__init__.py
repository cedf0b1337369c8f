"""An OpenAI-compatible speech API (FastAPI) in front of the Triton server: `create_app(Settings(...))`."""

from tritontts.openai_api.app import create_app
from tritontts.openai_api.settings import ModelRoute, Settings

__all__ = ["ModelRoute", "Settings", "create_app"]
