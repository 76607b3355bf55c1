"""The vLLM engine as a :class:`~optima_env.policy.TurnEngine`: each reply back as soon as it is done.

:class:`VLLMTurns` is the part of :class:`~optima_env.backends.vllm.VLLMPolicy` that drives vLLM's
own engine (``LLM.llm_engine``, a ``vllm.v1.engine.llm_engine.LLMEngine``) request by request, the
way ``LLM.generate`` does internally for a whole batch: ``submit`` renders the prompt exactly as
``generate`` does and hands it to ``LLMEngine.add_request`` at once, with its own
``SamplingParams(seed=...)``; vLLM's scheduler admits it into its running batch (continuous
batching, prefix caching); ``poll`` calls ``LLMEngine.step`` until at least one request has finished.
No scheduling of our own: the engine decides what runs in each step.

Counters, for benchmarks (they only count requests that went through ``submit``/``poll``):

* :attr:`VLLMTurns.steps`: engine steps whose outputs ``poll`` collected (one per
  ``LLMEngine.step`` call, each one engine-core step that sampled at least one token; a step that
  only prefilled part of a prompt samples none and is not counted, which cannot happen with chunked
  prefill off, vLLM-CPU's default here);
* :attr:`VLLMTurns.generated_tokens`: tokens sampled for the requests that finished (end-of-sequence
  and stop-string tokens included; a request aborted after a failure is not counted);
* :attr:`VLLMTurns.slot_utilization`: ``generated_tokens / (capacity * steps)``, the share of the
  engine's batch slots that decoded a token of a reply.

Other work can join the same running batch without disturbing the turns: :meth:`VLLMTurns._run_beside`
adds its own requests (the engine's readability scoring,
:class:`~optima_env.backends.vllm_lora.EngineLMLoss`, during a tree stage's growth) and steps the
engine until they are done; turns that finish meanwhile are kept for the next :meth:`~VLLMTurns.poll`.
Every request carries the policy's active LoRA adapter, if any (:meth:`_lora_request`).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from optima_env.errors import BackendError, TaskContractError
from optima_env.policy import GenerationRequest, SamplingParams, finish_reply

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["VLLMTurns"]

logger = logging.getLogger(__name__)

_REQUEST_PREFIX = "optima-turn-"
"""Our request ids in the engine; ``LLM.generate`` numbers its own "0", "1", ..., so they never meet."""
_BESIDE_PREFIX = "optima-beside-"
"""The ids of :meth:`VLLMTurns._run_beside`'s requests."""


class VLLMTurns:
    """``capacity`` / ``submit`` / ``poll`` over the ``vllm.LLM`` held in ``self.llm``.

    Mixed into :class:`~optima_env.backends.vllm.VLLMPolicy`, which provides ``llm`` and
    ``_engine_input`` (the one place a request becomes a vLLM prompt and sampling parameters).
    Submitted requests still pending when ``generate``, ``load_weights`` or ``sleep`` is called
    are aborted first, with a warning (:meth:`_drop_pending`): ``LLM.generate`` steps the same
    engine and would take their outputs, and new weights would change their replies half-way.
    Such leftovers come from a rollout that ended early (its ``on_episode`` raised), whose replies
    the next call would drop anyway (:mod:`optima_env.rollout`). :meth:`abort` drops them at once.
    """

    llm: Any
    seeded_token_budget: int | None
    _engine_input: Callable[[GenerationRequest, SamplingParams], tuple[Any, Any]]
    _lora_request: Callable[[], Any]

    def _init_turns(self) -> None:
        self._pending: dict[str, tuple[int, GenerationRequest, SamplingParams]] = {}
        """Engine request id -> (ticket, request, sampling) of every submitted, unreturned request."""
        self._ids = itertools.count()
        self._finished: list[tuple[int, str]] = []
        """Turns that finished while :meth:`_run_beside` stepped the engine, for the next :meth:`poll`."""
        self._failure: BaseException | None = None
        """An error of ``add_request``, raised by the next :meth:`poll` (the contract's one place)."""
        self.steps = 0
        """Engine steps collected by :meth:`poll` (see the module docstring)."""
        self.generated_tokens = 0
        """Tokens sampled for the requests :meth:`poll` returned."""

    @property
    def capacity(self) -> int:
        """The engine's batch slots: vLLM's ``max_num_seqs`` (requests decoded in one step)."""
        return int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)

    @property
    def slot_utilization(self) -> float | None:
        """``generated_tokens / (capacity * steps)``; ``None`` before the first step."""
        return self.generated_tokens / (self.capacity * self.steps) if self.steps else None

    @property
    def pending(self) -> int:
        """Requests submitted and not yet returned by :meth:`poll`."""
        return len(self._pending) + len(self._finished)

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """Add ``request`` to the engine now, under ``ticket``; vLLM schedules it with its next step."""
        if not isinstance(ticket, int) or isinstance(ticket, bool):
            raise TaskContractError(f"a ticket must be an int, got {type(ticket).__name__} {ticket!r}")
        if any(t == ticket for t, _, _ in self._pending.values()):
            raise TaskContractError(
                f"ticket {ticket} is already pending; give each pending request its own ticket"
            )
        if self.llm is None:
            raise TaskContractError("this VLLMPolicy is closed; start a new one to submit requests")
        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        if sampling.seed is not None and self.seeded_token_budget and scheduler.enable_chunked_prefill:
            raise TaskContractError(
                "a seeded request cannot be submitted to this vLLM-CPU engine: it has chunked prefill on, "
                "and vLLM-CPU 0.32 fails on a seeded prompt prefilled over several steps (the engine "
                "dies); start it with enable_chunked_prefill=False (VLLMPolicy.from_pretrained does on "
                "CPUs), or use generate(), which sends seeded batches that fit one step"
            )
        from vllm.sampling_params import RequestOutputKind

        prompt, params = self._engine_input(request, sampling)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it is done
        request_id = f"{_REQUEST_PREFIX}{next(self._ids)}"
        if self._failure is None:
            try:
                engine = self.llm.llm_engine
                (rendered,) = engine.renderer.render_cmpl([prompt])  # as LLM.generate renders its prompts
                engine.add_request(request_id, rendered, params, lora_request=self._lora_request())
            except Exception as exc:  # e.g. a prompt longer than max_model_len: raised by poll
                self._failure = exc
        self._pending[request_id] = (ticket, request, sampling)

    def poll(self) -> list[tuple[int, str]]:
        """Step the engine until at least one submitted request finished; its ``(ticket, reply)`` pairs.

        Raises:
            BackendError: the engine failed (or refused a submitted request); every pending request
                is then aborted in the engine and forgotten.
        """
        if self._finished:  # finished while other requests ran beside them
            finished, self._finished = self._finished, []
            return finished
        if not self._pending:
            return []
        engine = self.llm.llm_engine
        done: list[tuple[int, str]] = []
        try:
            if self._failure is not None:
                raise self._failure
            while not done:
                if not engine.has_unfinished_requests():  # pragma: no cover - vLLM returns every request
                    raise RuntimeError(f"the engine holds none of the {len(self._pending)} pending requests")
                done += self._collect(engine.step())
        except Exception as exc:
            pending = len(self._pending)
            self.abort()
            raise BackendError(
                f"vLLM failed with {pending} submitted requests pending ({type(exc).__name__}: {exc}); "
                "they were aborted in the engine: resubmit the ones to replay"
            ) from exc
        return done

    def _collect(self, outputs: list[Any]) -> list[tuple[int, str]]:
        """The ``(ticket, reply)`` of each submitted turn that finished in one engine step's
        ``outputs`` (counted in :attr:`steps` and :attr:`generated_tokens`)."""
        self.steps += 1
        done = []
        for output in outputs:
            entry = self._pending.pop(output.request_id, None) if output.finished else None
            if entry is None:  # another request's output (:meth:`_run_beside`), or not finished
                continue
            ticket, request, sampling = entry
            completion = output.outputs[0]
            self.generated_tokens += len(completion.token_ids)
            done.append((ticket, finish_reply(request.prefix, completion.text, sampling.stop)))
        return done

    def _run_beside(self, prompts: list[Any], params: Any, lora_request: Any) -> list[Any]:
        """Run ``prompts`` (vLLM prompts, one ``params`` for all) in the engine beside the pending
        turns, stepping it until every one is done; their ``RequestOutput``s in order. Turns that
        finish meanwhile wait in :attr:`_finished` for the next :meth:`poll` (they are not
        aborted); an engine failure aborts everything, as in :meth:`poll`."""
        from vllm.sampling_params import RequestOutputKind

        if self.llm is None:
            raise TaskContractError("this VLLMPolicy is closed; start a new one to score with it")
        engine = self.llm.llm_engine
        params.output_kind = RequestOutputKind.FINAL_ONLY
        ids = [f"{_BESIDE_PREFIX}{next(self._ids)}" for _ in prompts]
        wanted = set(ids)
        results: dict[str, Any] = {}
        try:
            for request_id, rendered in zip(ids, engine.renderer.render_cmpl(prompts)):
                engine.add_request(request_id, rendered, params, lora_request=lora_request)
            while len(results) < len(ids):
                if not engine.has_unfinished_requests():  # pragma: no cover - vLLM returns every request
                    raise RuntimeError(f"the engine holds none of the {len(ids) - len(results)} requests")
                outputs = engine.step()
                results.update((o.request_id, o) for o in outputs if o.request_id in wanted and o.finished)
                if self._pending:
                    self._finished += self._collect(outputs)
        except Exception as exc:
            left = [i for i in ids if i not in results]
            pending = len(self._pending)
            self.abort()
            if left:
                engine.abort_request(left)
            raise BackendError(
                f"vLLM failed on {len(ids)} requests run beside {pending} submitted turns "
                f"({type(exc).__name__}: {exc}); the turns were aborted in the engine: resubmit the "
                "ones to replay"
            ) from exc
        return [results[i] for i in ids]

    def abort(self) -> None:
        """Abort every pending request in the engine and forget it (for a caller that stops polling early)."""
        self._finished = []
        ids, self._pending, self._failure = list(self._pending), {}, None
        if ids and self.llm is not None:
            try:
                self.llm.llm_engine.abort_request(ids)
            except Exception as exc:  # pragma: no cover - a dead engine has nothing left to abort
                logger.warning("vLLM could not abort %d requests (%s: %s)", len(ids), type(exc).__name__, exc)

    def _drop_pending(self, action: str) -> None:
        """Abort the submitted requests still pending before ``action``, saying so."""
        if self._pending or self._finished:
            logger.warning(
                "VLLMPolicy: aborting %d submitted requests still pending in the engine, to %s (poll() "
                "until they have returned, or abort() them, to keep this quiet)",
                self.pending,
                action,
            )
            self.abort()
