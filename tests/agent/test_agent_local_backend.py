"""The local backend over a stand-in service: a conversation's saved state is adopted only when
the next prompt continues it (the state may be cut back by at most MAX_CUT tokens), a prompt
that does not fit is a BackendError, states are kept only with a prompt cache, and a turn and a
count use the run's settings."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ds4mlx.agent import backend as backend_module
from ds4mlx.agent.backend import BackendError, LocalBackend
from ds4mlx.engine.session import Snapshot
from ds4mlx.generation import MAX_CUT, SamplingOptions, SnapshotFileError, TextDelta

import pytest

MESSAGES = [{"role": "user", "content": "hi"}]
# The next turn's prompt; its last token opens the user message that follows.
NEXT_PROMPT = [10, 11, 12, 13, 14, 15, 16, 17, 99]


class Service:
    """What LocalBackend uses of a ChatService."""

    def __init__(self, *, prompt_cache: object | None = object(), chat_format: object = "fmt"):
        self.model = SimpleNamespace(path=Path("/models/tiny.gguf"), chat_format=chat_format)
        self.max_context = 321
        self.prompt_cache = prompt_cache
        self.prompts: list[list[dict]] = []
        self.adopted: list[Snapshot] = []

    def chat_prompt(self, messages, tools, *, thinking):
        self.prompts.append(list(messages))
        return list(NEXT_PROMPT)

    def adopt(self, snapshot: Snapshot) -> None:
        self.adopted.append(snapshot)


def local(service: Service) -> LocalBackend:
    backend = LocalBackend(service)
    backend._fingerprint = "the model"  # no model to fingerprint
    return backend


def saved(monkeypatch, tokens: list[int]) -> Snapshot:
    snapshot = Snapshot(None, tuple(tokens))
    monkeypatch.setattr(backend_module, "read_snapshot", lambda path, fingerprint: snapshot)
    return snapshot


@pytest.mark.parametrize("ahead", [0, 1, MAX_CUT])
def test_a_state_at_most_max_cut_tokens_ahead_is_adopted(monkeypatch, ahead):
    service = Service()
    shared = NEXT_PROMPT[:5]
    snapshot = saved(monkeypatch, shared + [7] * ahead)
    assert local(service).restore_state(Path("s"), MESSAGES, [], thinking=False) == len(shared)
    assert service.adopted == [snapshot]
    # The prompt asked for is the conversation's next turn: an empty user message follows.
    assert service.prompts == [[*MESSAGES, {"role": "user", "content": ""}]]


def test_a_state_one_token_more_than_max_cut_ahead_is_stale(monkeypatch):
    """(fresh8's backend_state_cut_of_exactly_max_cut_refused)"""
    service = Service()
    saved(monkeypatch, NEXT_PROMPT[:5] + [7] * (MAX_CUT + 1))
    with pytest.raises(SnapshotFileError, match=r"^s: stale \(the conversation changed"):
        local(service).restore_state(Path("s"), MESSAGES, [], thinking=False)
    assert service.adopted == []


def test_the_opening_of_the_next_user_message_is_not_part_of_the_share(monkeypatch):
    """The state ends where the conversation does; the token that opens the next user
    message is the turn's own."""
    service = Service()
    saved(monkeypatch, NEXT_PROMPT)  # one token past the conversation
    assert local(service).restore_state(Path("s"), MESSAGES, [], thinking=False) == 8


def test_save_state_writes_the_longest_state_held(monkeypatch, tmp_path):
    service = Service()
    held = Snapshot(None, (10, 11, 12))
    service.cached_state = lambda tokens: held if tokens == NEXT_PROMPT else None
    written = []
    monkeypatch.setattr(
        backend_module, "write_snapshot", lambda *args: written.append(args) or 1234
    )
    path = tmp_path / "c.kv.safetensors"
    assert local(service).save_state(path, MESSAGES, [], thinking=False) == 3
    assert written == [(path, held, "the model")]
    service.cached_state = lambda tokens: None
    assert local(service).save_state(path, MESSAGES, [], thinking=False) == 0
    assert len(written) == 1


def test_states_are_kept_only_with_a_prompt_cache():
    assert local(Service()).keeps_states
    assert not local(Service(prompt_cache=None)).keeps_states


def test_the_name_and_context_come_from_the_service():
    backend = LocalBackend(Service())
    assert (backend.name, backend.context_size) == ("tiny", 321)
    assert LocalBackend(Service(), name="mine").name == "mine"


def test_a_model_without_a_chat_template_is_refused():
    with pytest.raises(BackendError, match=r"^tiny.gguf has no chat template$"):
        LocalBackend(Service(chat_format=None))


def test_a_prompt_that_does_not_fit_is_a_backend_error_and_the_stream_is_closed():
    service = Service()
    closed = []

    def chat(*args, **kwargs):
        try:
            yield from ()
            raise ValueError("the prompt (900 tokens) does not fit the context of 321")
        finally:
            closed.append(True)

    service.chat = chat
    with pytest.raises(BackendError, match=r"^the prompt \(900 tokens\) does not fit"):
        list(LocalBackend(service).chat(MESSAGES, [], max_tokens=8, thinking=False))
    assert closed == [True]


@pytest.mark.parametrize(
    ("stats", "rate"),
    [
        (None, None),
        (SimpleNamespace(kind="resident", hit_rate=1.0), None),
        (SimpleNamespace(kind="streamed", hit_rate=0.25), 0.25),
    ],
)
def test_the_expert_hit_rate_is_shown_only_for_streamed_experts(stats, rate):
    service = Service()
    service.model.expert_stats = lambda: stats
    assert LocalBackend(service).expert_hit_rate() == rate


def test_a_turn_asks_the_service_for_progress_with_the_runs_settings():
    service = Service()
    asked = []

    def chat(messages, tools, **options):
        asked.append((messages, tools, options))
        yield TextDelta("hi")

    service.chat = chat
    sampling = SamplingOptions(temperature=0.0)
    tools = [{"type": "function", "function": {"name": "read"}}]
    events = list(
        LocalBackend(service, sampling).chat(MESSAGES, tools, max_tokens=7, thinking=True)
    )
    assert events == [TextDelta("hi")]
    assert asked == [
        (
            MESSAGES,
            tools,
            {"max_tokens": 7, "sampling": sampling, "thinking": True, "report_prefill": True},
        )
    ]


@pytest.mark.parametrize("thinking", [False, True])
def test_tokens_are_counted_on_the_prompt_rendered_with_the_runs_thinking(thinking):
    rendered = []

    class Format:
        def render(self, messages, tools, *, thinking):
            rendered.append(thinking)
            return "<prompt>" * (2 if thinking else 1)

    service = Service(chat_format=Format())
    service.count_tokens = len
    assert LocalBackend(service).count_tokens(MESSAGES, [], thinking=thinking) == (
        16 if thinking else 8
    )
    assert rendered == [thinking]
