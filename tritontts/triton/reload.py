"""Change a loaded model's string parameters without restarting the server: rewrite them in the model's
`config.pbtxt` and load the model again (tritonserver started with `--model-control-mode=explicit`). The other
models keep serving, so an A/B of token2wav settings needs one LLM load (with `torch.compile`, minutes), not one
per setting."""

from __future__ import annotations

import re
from pathlib import Path

_PARAMETER = r'(\{{\s*key:\s*"{key}"\s*,\s*value:\s*\{{\s*string_value:\s*")([^"]*)("\s*\}}\s*\}})'
_ANY_PARAMETER = re.compile(r'\{\s*key:\s*"([^"]+)"\s*,\s*value:\s*\{\s*string_value:')


class ReloadError(RuntimeError):
    """The model could not be loaded again with the new parameters; its config file is as it was."""


def parse_settings(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` items as a dict; a ValueError names an item without `=` or with an empty key."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes KEY=VALUE, got '{item}'")
        settings[key.strip()] = value
    return settings


def with_parameters(config_text: str, settings: dict[str, str]) -> str:
    """The config text with each parameter of `settings` set to its value; a ValueError names the keys the
    config does not have (and those it has), so a misspelt key is never added and silently ignored."""
    known = _ANY_PARAMETER.findall(config_text)
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(
            f"no parameter {', '.join(unknown)} in this config; it has: {', '.join(known) or 'none'}"
        )
    for key, value in settings.items():
        if '"' in value or "\\" in value:
            raise ValueError(f"parameter {key}: the value must not hold quotes or backslashes, got {value!r}")
        pattern = re.compile(_PARAMETER.format(key=re.escape(key)))
        config_text = pattern.sub(lambda m, value=value: m.group(1) + value + m.group(3), config_text)
    return config_text


def reload_with_parameters(
    repo: Path, model: str, settings: dict[str, str], http_url: str, timeout_s: float = 600.0
) -> dict[str, str]:
    """Set `settings` in `repo/model/config.pbtxt` and load `model` again through the server at `http_url`;
    returns the string parameters the server now has for it. On a failed load the file is restored and a
    ReloadError carries the server's message (the server keeps the version it had)."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    path = repo / model / "config.pbtxt"
    if not path.is_file():
        raise ReloadError(f"no model '{model}' in {repo} ({path} is missing)")
    before = path.read_text(encoding="utf-8")
    path.write_text(with_parameters(before, settings), encoding="utf-8")
    client = httpclient.InferenceServerClient(http_url, network_timeout=timeout_s, connection_timeout=10.0)
    try:
        client.load_model(model)
        served = client.get_model_config(model)
    except InferenceServerException as err:
        path.write_text(before, encoding="utf-8")
        hint = ""
        if "explicit" in str(err) or "polling" in str(err):
            hint = " (start the server with --model-control-mode=explicit --load-model=*)"
        raise ReloadError(f"loading '{model}' again failed: {err}{hint}") from err
    finally:
        client.close()
    return {key: value.get("string_value", "") for key, value in served.get("parameters", {}).items()}
