"""Turn engines under the rollout driver: :class:`BatchTurns`, any :class:`ChatPolicy` as a
:class:`~optima_env.policy.TurnEngine`, and the checks of what an engine hands back.

:func:`optima_env.rollout.rollout` drives every policy through the submit/poll contract of
:class:`~optima_env.policy.TurnEngine`. A backend that schedules requests on its own (continuous
batching, concurrent HTTP requests) implements it natively; every other policy is wrapped in
:class:`BatchTurns`, which answers everything submitted since the last ``poll`` as one
``generate`` batch: a barrier per turn, the driver's behaviour before turn engines existed.

Written here rather than taken from a library because the contract is this project's own: a
ticketed queue in front of a one-method batch interface.
"""

from __future__ import annotations

from collections.abc import Sequence

from optima_env.errors import TaskContractError
from optima_env.policy import ChatPolicy, GenerationRequest, SamplingParams, TurnEngine

__all__ = ["DRIVERS", "BatchTurns", "reply_problem", "turn_engine"]


def reply_problem(replies: object, wanted: int) -> str | None:
    """What is wrong with ``replies`` as the answer to ``wanted`` requests (``None``: nothing).

    >>> reply_problem(["a", "b"], 2) is None
    True
    >>> reply_problem(["a"], 2)
    'must return a list of 2 replies (one per request), got 1 replies'
    """
    if not isinstance(replies, list) or len(replies) != wanted:
        got = f"{len(replies)} replies" if isinstance(replies, list) else repr(replies)[:80]
        return f"must return a list of {wanted} replies (one per request), got {got}"
    bad = next(((i, r) for i, r in enumerate(replies) if not isinstance(r, str)), None)
    if bad is None:
        return None
    index, reply = bad
    return f"returned {type(reply).__name__} {reply!r:.60} as reply {index}; every reply must be a str"


class BatchTurns:
    """Any :class:`ChatPolicy` as a :class:`~optima_env.policy.TurnEngine`: one batch per ``poll``.

    ``submit`` only queues; ``poll`` sends every queued request to ``policy.generate`` as one batch,
    in submit order (one batch per distinct :class:`SamplingParams`, in the order each was first
    submitted), and returns every ``(ticket, reply)`` pair in submit order. The rollout driver
    submits the running conversations' turns in job order, so the batches are exactly those of a
    driver that gathers every conversation's turn and waits for the batch's longest reply.

    Args:
        policy: the policy that generates.

    >>> from optima_env.policy import ScriptedPolicy
    >>> turns = BatchTurns(ScriptedPolicy(lambda r: "hi"))
    >>> turns.submit(7, GenerationRequest(messages=[], prefix="Bob:"), SamplingParams())
    >>> turns.submit(3, GenerationRequest(messages=[], prefix="Alice:"), SamplingParams())
    >>> turns.poll(), turns.poll()
    ([(7, 'Bob: hi'), (3, 'Alice: hi')], [])
    """

    def __init__(self, policy: ChatPolicy) -> None:
        if isinstance(policy, BatchTurns):
            policy = policy.policy
        self.policy = policy
        self._queue: list[tuple[int, GenerationRequest, SamplingParams]] = []

    @property
    def capacity(self) -> int | None:
        """The wrapped policy's ``capacity`` when it declares one as an int, else ``None``."""
        capacity = getattr(self.policy, "capacity", None)
        return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) else None

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[str]:
        """The wrapped policy's ``generate``."""
        return self.policy.generate(requests, sampling)

    def submit(self, ticket: int, request: GenerationRequest, sampling: SamplingParams) -> None:
        """Queue ``request`` under ``ticket`` (unique among the queued ones) for the next ``poll``."""
        if any(t == ticket for t, _, _ in self._queue):
            raise TaskContractError(
                f"ticket {ticket!r} is already pending; give each pending request its own"
            )
        self._queue.append((ticket, request, sampling))

    def poll(self) -> list[tuple[int, str]]:
        """Generate every queued request (see the class docstring); ``[]`` when none is queued.

        The queue is emptied first, so after a failure nothing stays pending (the contract).

        Raises:
            TaskContractError: the policy's ``generate`` returned other than one str per request.
        """
        queued, self._queue = self._queue, []
        groups: dict[SamplingParams, list[tuple[int, GenerationRequest]]] = {}
        for ticket, request, sampling in queued:
            groups.setdefault(sampling, []).append((ticket, request))
        done: dict[int, str] = {}
        for sampling, group in groups.items():
            replies = self.policy.generate([request for _, request in group], sampling)
            problem = reply_problem(replies, len(group))
            if problem is not None:
                raise TaskContractError(
                    f"the policy {type(self.policy).__name__}.generate {problem}; "
                    "fix the policy to return one str per request"
                )
            done.update((ticket, reply) for (ticket, _), reply in zip(group, replies))
        return [(ticket, done[ticket]) for ticket, _, _ in queued]


DRIVERS = ("auto", "batch", "turns")
"""The rollout drivers: ``auto`` (the policy's own turn engine when it implements
:class:`~optima_env.policy.TurnEngine`, else ``batch``), ``batch`` (:class:`BatchTurns` over
``policy.generate``, a barrier per turn, even for a turn engine) and ``turns`` (the policy's own
turn engine; an error for a policy without one)."""


def turn_engine(policy: ChatPolicy, driver: str = "auto") -> TurnEngine:
    """The :class:`~optima_env.policy.TurnEngine` that plays ``policy`` under ``driver`` (:data:`DRIVERS`).

    >>> from optima_env.policy import ScriptedPolicy
    >>> type(turn_engine(ScriptedPolicy(lambda r: "hi"))).__name__
    'BatchTurns'
    """
    if driver not in DRIVERS:
        raise TaskContractError(f"driver must be one of {', '.join(DRIVERS)}, got {driver!r}")
    native = isinstance(policy, TurnEngine)
    if driver == "turns" and not native:
        raise TaskContractError(
            f"driver='turns' needs a policy that implements TurnEngine (capacity, submit, poll); "
            f"{type(policy).__name__} does not: use driver='auto' or driver='batch'"
        )
    if driver == "batch" or not native:
        return BatchTurns(policy)
    return policy
