"""ConversationEnv: one PettingZoo AEC environment for turn-based multi-agent conversations.

Both task families use it: information exchange and solver/critic debate differ only in the
task's views (prompts, private evidence, roles). Agents speak in a fixed rotation (Alice first).

Conversation rules (spec §2.4, the reference code's behaviour):

* A running *current answer*, initially empty. When a turn carries a non-empty answer (the task's
  extraction), the episode **terminates** if it equals the current answer exactly; otherwise it
  becomes the current answer. The final answer is the current answer when the episode ends.
  ``termination="all_agents"`` (the paper's rule, spec §13 item 12) ends it instead once every
  agent's latest answer is the same (:mod:`optima_env.rules`).
* After ``max_turns`` turns (default 10) the episode is **truncated**.
* With ``max_prompt_tokens`` (the model's context minus the turn cap), a conversation whose next
  prompt would not fit ends there, **truncated** with ``end_reason="context_full"`` (a first prompt
  that does not fit is a :class:`~optima_env.errors.TaskContractError` naming the instance).
* A turn of ``turn_token_cap`` tokens or more (default 2000), or of more than
  ``MAX_CHARS_PER_TOKEN`` (16) characters per token of that cap whatever the counter says, is
  replaced by the marker ``large`` and the episode is truncated. An action longer than
  ``ACTION_MAX_LENGTH`` (400,000 characters) is refused with :class:`TaskContractError`.
* Each turn starts with ``"Name:"``; the env adds the prefix when a reply lacks it. Token counts
  use the policy's tokenizer on the turn text with its prefix; system prompts are not counted.

Observations and actions are ``str`` in :class:`~optima_env.spaces.ConversationText`. An agent's
observation is its system prompt and the transcript; :meth:`ConversationEnv.chat_messages` gives
the same as chat messages for an LLM. The task score uses the policy's tokenizer when the task
takes one (the reference's token F1, :mod:`optima_env.families.scoring`); the scorer's name is in
``episode.metadata["scorer"]``. All agents share the episode reward, paid when it ends
(:mod:`optima_env.reward` with a fixed token normalizer; trainers re-score groups, and pass
``scoring=False`` to skip it). ``step``, ``observe``, ``last`` and ``chat_messages`` before the
first ``reset`` raise :class:`~optima_env.errors.EnvNotResetError`. The finished
:class:`~optima_env.types.Episode` is in ``infos[agent]["episode"]`` and goes to the
``optima_episode_end`` hook.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pettingzoo import AECEnv

from optima_env._env_checks import (
    check_action,
    check_env_options,
    check_prompt_budget,
    check_seed,
    draw_instance,
    episode_over,
    episode_record,
    not_reset,
)
from optima_env.episode_scorer import EpisodeScorer
from optima_env.errors import TaskContractError
from optima_env.families.scoring import scorer_name
from optima_env.reward import LARGE_TURN_MARKER, RewardConfig
from optima_env.rules import AnswerTracker, check_termination, checked_score
from optima_env.spaces import ACTION_MAX_LENGTH, OBSERVATION_MAX_LENGTH, ConversationText, TextObservation
from optima_env.task import Task
from optima_env.tokens import MAX_CHARS_PER_TOKEN, as_token_counter
from optima_env.types import AgentView, Episode, TaskSample, Turn

if TYPE_CHECKING:
    import pluggy

__all__ = ["ConversationEnv"]

logger = logging.getLogger(__name__)

MessageFormat = Literal["code", "alternating"]


class ConversationEnv(AECEnv):
    """A turn-based conversation among the task's agents about one task instance.

    Args:
        task: the task (from :func:`optima_env.make_task` or any :class:`~optima_env.task.Task`).
        split: the data split episodes are drawn from (``train`` or ``test``).
        max_turns: turns before truncation (spec: 10 in total, 5 per agent for two agents).
        turn_token_cap: a turn with this many tokens or more becomes ``large`` and ends the episode;
            so does one longer than ``MAX_CHARS_PER_TOKEN * turn_token_cap`` characters
            (:attr:`turn_char_cap`), whatever the token counter says.
        tokenizer: the policy's tokenizer (or a token counter); ``None`` uses a regex approximation.
            A tokenizer also scores the tasks that take one (information exchange's token F1).
        reward_config: weights and special cases of the episode reward.
        scoring: compute the episode reward (``episode.reward``, paid to every agent at the end).
            ``False``: no reward is computed: ``episode.reward`` is ``None`` and the rewards paid
            are 0.0 (trainers score episodes themselves with the run's reward config; the task
            score and ``lm_loss`` are still recorded).
        max_prompt_tokens: the longest prompt the model takes (its context length minus the turn
            cap); counted with ``tokenizer``'s chat template before each turn. A conversation whose
            next prompt is longer ends there (``context_full``, truncated); ``None``: no limit.
        token_normalizer: the constant token normalizer of the per-episode reward.
        readability: callable mapping turn texts to per-turn LM losses (frozen base model); when
            given, the env computes ``lm_loss`` (max over turns) at the end of each episode.
        diverse_formats: draw one format instruction from the task's prompt pool per episode.
        message_format: ``code``: every turn is an ``assistant`` message (reference code);
            ``alternating``: the agent's own turns are ``assistant``, everyone else's ``user``.
        termination: ``repeat`` (the reference: the same answer twice in a row among
            answer-bearing turns) or ``all_agents`` (the paper: every agent's latest answer equal).
        cycle_aligned: end episodes only at the end of a rotation (the agents after the one who
            ended it pass), so that PettingZoo's ``aec_to_parallel`` can wrap the env; the episode
            record is complete as soon as it ends either way.
        render_mode: ``None``, ``"human"`` (print) or ``"ansi"`` (return the transcript).
        pm: the plugin manager whose ``optima_episode_*`` hooks are fired.
    """

    # Every attribute the env has is set in __init__ (the per-episode ones are reset by reset()).
    possible_agents: list[str]  # the task's agents, in speaking order
    agents: list[str]  # agents still in the episode (empty before reset and once all have left)
    rewards: dict[str, float]  # reward of the last step, per agent
    _cumulative_rewards: dict[str, float]  # reward since the agent last acted (PettingZoo's)
    terminations: dict[str, bool]  # the episode ended by agreement
    truncations: dict[str, bool]  # the episode ended otherwise (max_turns, a large turn)
    infos: dict[str, dict[str, Any]]  # {"episode": Episode} once it has ended
    agent_selection: str  # the agent to act next

    metadata = {
        "name": "optima_conversation_v0",
        "render_modes": ["human", "ansi"],
        "is_parallelizable": True,
    }

    # size: the env's documented options (PettingZoo's make(**kwargs)), each a keyword with a default
    def __init__(
        self,
        task: Task,
        *,
        split: str = "train",
        max_turns: int = 10,
        turn_token_cap: int = 2000,
        tokenizer: Any = None,
        reward_config: RewardConfig | None = None,
        token_normalizer: float = 1000.0,
        readability: Callable[[Sequence[str]], Sequence[float]] | None = None,
        diverse_formats: bool = False,
        message_format: MessageFormat = "code",
        termination: str = "repeat",
        cycle_aligned: bool = False,
        render_mode: str | None = None,
        pm: pluggy.PluginManager | None = None,
        scoring: bool = True,
        max_prompt_tokens: int | None = None,
    ) -> None:
        super().__init__()
        check_env_options(
            task,
            max_turns=max_turns,
            turn_token_cap=turn_token_cap,
            message_format=message_format,
            render_mode=render_mode,
            render_modes=self.metadata["render_modes"],
            scoring=scoring,
            diverse_formats=diverse_formats,
        )
        self.task = task
        self.split = split
        self.max_turns = max_turns
        self.turn_token_cap = turn_token_cap
        self.turn_char_cap = MAX_CHARS_PER_TOKEN * turn_token_cap
        self.token_counter = as_token_counter(tokenizer)
        self.tokenizer = tokenizer
        self.termination = check_termination(termination)
        self.scorer = scorer_name(task, tokenizer)
        self.reward_config = reward_config or RewardConfig()
        self.scoring = scoring
        self.token_normalizer = float(token_normalizer)
        self.readability = readability
        self.diverse_formats = diverse_formats
        self.message_format = message_format
        self.cycle_aligned = cycle_aligned
        self.metadata = {**self.metadata, "is_parallelizable": cycle_aligned}
        self.render_mode = render_mode
        self.pm = pm
        self.max_prompt_tokens = check_prompt_budget(max_prompt_tokens, tokenizer)

        self.possible_agents = list(task.agents)
        self._action_space = ConversationText(ACTION_MAX_LENGTH)
        self._observation_space = ConversationText(OBSERVATION_MAX_LENGTH)
        # per-episode state, set by reset(); _sample is None until the first reset
        self.agents = []
        self.rewards = {}
        self._cumulative_rewards = {}
        self.terminations = {}
        self.truncations = {}
        self.infos = {}
        self.agent_selection = self.possible_agents[0]
        self._skip_agent_selection: str | None = None  # PettingZoo's _was_dead_step bookkeeping
        self._sample: TaskSample | None = None
        self._seed: int | None = None
        self._views: dict[str, AgentView] = {}
        self._format_index: int | None = None
        self._turns: list[Turn] = []
        self._answers = AnswerTracker(self.termination, self.possible_agents)
        self._speaker_index = 0
        self._episode: Episode | None = None

    # -- spaces ---------------------------------------------------------------------------------
    def observation_space(self, agent: str) -> ConversationText:
        return self._observation_space

    def action_space(self, agent: str) -> ConversationText:
        return self._action_space

    # -- lifecycle ------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> None:
        """Start a conversation.

        Args:
            seed: an ``int`` (numpy integers are converted) or ``None``; seeds the choice of
                instance (when none is given), the dealing of evidence and the format drawn from
                the pool. Anything else raises :class:`TaskContractError`.
            options: ``{"index": i}`` picks instance ``i`` of the split; ``{"sample": TaskSample}``
                plays that instance; ``{"format_index": k}`` forces pool format ``k`` (or ``None``);
                ``{"prefix": [text, ...]}`` replays those utterances as the first turns (same rules
                as ``step``; used to continue a conversation from a tree node). A prefix that ends
                the episode raises :class:`TaskContractError`.
        """
        seed = check_seed(seed)
        options = dict(options or {})
        rng = random.Random(seed)
        self._seed = seed
        sample, format_index = draw_instance(
            self.task, self.split, options, rng=rng, diverse_formats=self.diverse_formats
        )
        views = dict(self.task.views(sample, rng=rng, format_index=format_index))
        if set(views) != set(self.possible_agents):
            raise TaskContractError(
                f"task {self.task.id!r} returned views for {sorted(views)}, expected {self.possible_agents}"
            )
        self._sample = sample
        self._views = views
        self._format_index = format_index
        self._turns = []
        self._answers = AnswerTracker(self.termination, self.possible_agents)
        self._episode = None
        self._skip_agent_selection = None

        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._speaker_index = 0
        self.agent_selection = self.agents[0]
        if self.pm is not None:
            self.pm.hook.optima_episode_start(task_id=self.task.id, sample_id=sample.id, seed=seed)
        if self._prompt_over_budget(self.agent_selection):
            raise TaskContractError(
                f"instance {sample.id!r} (split {self.split!r}), turn 0: {self.agent_selection}'s first "
                f"prompt has more than max_prompt_tokens={self.max_prompt_tokens} tokens (the model's "
                "context minus the turn cap); raise generation.max_model_len, lower "
                "generation.max_new_tokens, or leave the instance out"
            )
        for text in options.get("prefix", ()):
            if self._episode is not None:
                raise TaskContractError(
                    f"the prefix has {len(options['prefix'])} turns but the episode ended after "
                    f"{len(self._turns)}; a prefix must stop before the conversation ends"
                )
            self.step(text)

    def observe(self, agent: str) -> str:
        """The agent's system prompt followed by the transcript so far."""
        view = self._view("observe", agent)
        lines = [view.system_prompt, ""] + [t.text for t in self._turns]
        return TextObservation("\n".join(lines)[:OBSERVATION_MAX_LENGTH])

    def chat_messages(self, agent: str) -> list[dict[str, str]]:
        """What ``agent`` reads, as chat messages: its system prompt and every turn so far."""
        messages = [{"role": "system", "content": self._view("chat_messages", agent).system_prompt}]
        for turn in self._turns:
            own = turn.agent == agent
            role = "assistant" if self.message_format == "code" or own else "user"
            messages.append({"role": role, "content": turn.text})
        return messages

    def last(self, observe: bool = True) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        """Observation, cumulative reward, terminated, truncated and info of the selected agent."""
        if self._sample is None:
            raise not_reset("last")
        if self.agent_selection not in self._cumulative_rewards:
            raise episode_over(self.agent_selection, "last()", self._episode, len(self._turns))
        return super().last(observe)

    def _view(self, method: str, agent: str) -> AgentView:
        if self._sample is None:
            raise not_reset(method)
        if agent not in self._views:
            raise TaskContractError(
                f"{method}({agent!r}): no such agent; the agents are {self.possible_agents}"
            )
        return self._views[agent]

    def reply_prefix(self, agent: str) -> str:
        """The ``"Name:"`` prefix a reply must start with (empty if the task does not enforce it)."""
        return f"{agent}:" if self.task.enforce_name_prefix else ""

    @property
    def sample(self) -> TaskSample:
        """The instance being played."""
        if self._sample is None:
            raise not_reset("sample")
        return self._sample

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The turns so far."""
        return tuple(self._turns)

    @property
    def episode(self) -> Episode | None:
        """The finished episode's record, or ``None`` while it is running."""
        return self._episode

    def step(self, action: str | None) -> None:
        """The selected agent says ``action`` (its utterance; ``None`` once the episode is over)."""
        if self._sample is None:
            raise not_reset("step")
        agent = self.agent_selection
        if agent not in self.terminations:  # every agent has already left the finished episode
            raise episode_over(agent, action, self._episode, len(self._turns))
        if self.terminations[agent] or self.truncations[agent]:
            if action is not None:
                raise episode_over(agent, action, self._episode, len(self._turns))
            self._was_dead_step(action)
            return
        action = check_action(agent, action)
        self._cumulative_rewards[agent] = 0.0
        if self._episode is not None:  # cycle_aligned: the episode ended earlier in this cycle
            self._advance_or_end()
            return
        text = self._with_prefix(agent, action)
        too_long = len(text) > self.turn_char_cap  # then not counted: it may be 400,000 characters
        num_tokens = self.turn_token_cap if too_long else self.token_counter.count(text)
        end_reason: str | None = None
        answer: str | None = None
        if num_tokens >= self.turn_token_cap:
            text = LARGE_TURN_MARKER
            num_tokens = self.token_counter.count(text)
            end_reason = "turn_too_long"
        else:
            answer = self.task.extract_answer(text) or None
            if self._answers.update(agent, answer):
                end_reason = "agreement"
        self._turns.append(
            Turn(index=len(self._turns), agent=agent, text=text, num_tokens=num_tokens, answer=answer)
        )
        if end_reason is None and len(self._turns) >= self.max_turns:
            end_reason = "max_turns"
        following = self.agents[(self._speaker_index + 1) % len(self.agents)]
        if end_reason is None and self._prompt_over_budget(following):
            end_reason = "context_full"  # the next prompt would not fit the model: ended, as at the turn cap

        if self.render_mode == "human":
            print(self._turns[-1].text)
        if end_reason is not None:
            self._record_episode(end_reason)
        self._advance_or_end()

    def _advance_or_end(self) -> None:
        """Pass the turn on, or pay the reward and end the episode for every agent.

        With ``cycle_aligned`` the end waits for the last agent of the rotation (the agents after
        the one who ended it only pass), as PettingZoo's ``aec_to_parallel`` requires.
        """
        last_in_cycle = self._speaker_index == len(self.agents) - 1
        if self._episode is not None and (last_in_cycle or not self.cycle_aligned):
            self._end_for_all_agents()
        else:
            for a in self.agents:
                self.rewards[a] = 0.0
            self._speaker_index = (self._speaker_index + 1) % len(self.agents)
            self.agent_selection = self.agents[self._speaker_index]
        self._accumulate_rewards()

    def _prompt_over_budget(self, agent: str) -> bool:
        """Whether ``agent``'s next prompt (chat template and generation prompt included) has more
        tokens than ``max_prompt_tokens`` (never, without a budget)."""
        if self.max_prompt_tokens is None:
            return False
        messages = self.chat_messages(agent)
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
        return len(ids) > self.max_prompt_tokens

    def _with_prefix(self, agent: str, text: str) -> str:
        prefix = self.reply_prefix(agent)
        stripped = text.strip()
        if not prefix or stripped.startswith(prefix):
            return stripped
        return f"{prefix} {stripped}" if stripped else prefix

    def _record_episode(self, end_reason: str) -> None:
        final_answer = self._answers.current
        episode = episode_record(
            self.task,
            self.sample,
            seed=self._seed,
            agents=self.possible_agents,
            turns=self._turns,
            views=self._views,
            final_answer=final_answer,
            task_score=checked_score(self.task, final_answer, self.sample, tokenizer=self.tokenizer),
            end_reason=end_reason,
            format_index=self._format_index,
            lm_loss=None,
            scorer=self.scorer,
        )
        # the one episode scorer (readability, then the reward with the env's constant normalizer)
        scorer = EpisodeScorer(
            self.reward_config, readability=self.readability, normalizer=self.token_normalizer
        )
        if self.scoring:
            (episode,) = scorer.score([episode])
        elif self.readability is not None:
            (episode,) = scorer.readable([episode])
        self._episode = episode
        if self.pm is not None:
            self.pm.hook.optima_episode_end(episode=self._episode)

    def _end_for_all_agents(self) -> None:
        episode = self._episode
        if episode is None:  # pragma: no cover - internal invariant
            raise TaskContractError("internal error: ending an episode that has no record")
        for a in self.agents:
            self.rewards[a] = episode.reward.total if episode.reward is not None else 0.0
            self.terminations[a] = episode.terminated
            self.truncations[a] = episode.truncated
            self.infos[a] = {"episode": episode}

    def render(self) -> str | None:
        """The transcript (``ansi``), or print it (``human``)."""
        if self.render_mode is None:
            return None
        transcript = "\n".join(t.text for t in self._turns)
        if self.render_mode == "ansi":
            return transcript
        print(transcript)
        return None

    def close(self) -> None:
        """Nothing to release."""
