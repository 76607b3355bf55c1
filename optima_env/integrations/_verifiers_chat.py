"""The chat harness of :mod:`optima_env.integrations.verifiers` (imported from there only).

Needs the ``optima[verifiers]`` extra.
"""

from __future__ import annotations

from typing import Any

from optima_env.errors import require

vf = require("verifiers.v1", "verifiers")

from verifiers.v1.dialects.chat import message_to_wire  # noqa: E402 - after the check above
from verifiers.v1.runtimes import ProgramResult  # noqa: E402

__all__ = ["PLUGIN_ID", "OptimaChatHarness", "OptimaChatHarnessConfig"]

PLUGIN_ID = "optima"
"""The verifiers taskset and harness id of the adapter."""


# -- the harness: one chat completion per turn, in process ----------------------------------------
class OptimaChatHarnessConfig(vf.HarnessConfig):
    id: str = PLUGIN_ID
    request_timeout: float | None = 600.0
    """Seconds one chat completion may take (None: no limit)."""


class OptimaChatHarness(vf.Harness[OptimaChatHarnessConfig]):
    """A tool-less chat turn run in process: the conversation so far goes to the interception
    endpoint as one chat completion, which verifiers records on the trace.

    Written here instead of using verifiers' ``null`` harness, which runs the same loop as a
    PEP 723 script that ``uv`` provisions from PyPI on first use (no network needed here).
    """

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_: Any) -> ProgramResult:
        import httpx

        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages.extend(message_to_wire(m) for m in prompt or [])
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.request_timeout, connect=30)
        ) as client:
            response = await client.post(
                f"{endpoint}/chat/completions",
                json={"model": ctx.model, "messages": messages},
                headers={"Authorization": f"Bearer {secret}"},
            )
        if response.status_code != 200:
            detail = f"chat completion failed with HTTP {response.status_code}: {response.text[:1000]}"
            return ProgramResult(exit_code=1, stdout="", stderr=detail)
        return ProgramResult(exit_code=0, stdout="", stderr="")
