"""``ds4-agent``'s runs without a model: the backend the flags load (a server's or the local
engine's, each piece a stand-in), ``--print``'s life (load errors, instructions and restored
states told, SIGTERM/SIGHUP, Ctrl+C, the closing save), and ``main``'s paths (ranks, a
conversation that cannot be resumed, the UI)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import ds4mlx.agent.app
import ds4mlx.generation
import ds4mlx.generation.ranks
import ds4mlx.loader
from ds4mlx.agent.backend import LocalBackend, OpenAIBackend
from ds4mlx.agent.conversations import Conversation
from ds4mlx.agent.loop import (
    CompactionStarted,
    FilesAttached,
    RunFinished,
    ToolStarted,
    TurnFinished,
)
from ds4mlx.cli import agent as agent_cli
from ds4mlx.engine.chat.events import ToolCall
from ds4mlx.generation.ranks import DistributedError

import pytest

API = ("--api-base", "http://127.0.0.1:1/v1")


@pytest.fixture
def server_context(monkeypatch):
    """The context size the stand-in server reports (None: it reports none)."""
    state = SimpleNamespace(size=None)
    monkeypatch.setattr(OpenAIBackend, "server_context_size", lambda self: state.size)
    return state


def test_a_server_backend_gets_the_flags(server_context):
    args = agent_cli._parse(
        [*API, "--api-model", "m1", "--api-key", "k1", "--temp", "0.3", "-c", "777"]
    )
    server_context.size = 9000
    backend = agent_cli.load_backend(args)
    assert isinstance(backend, OpenAIBackend)
    assert (backend.name, backend.client.api_key, str(backend.client.base_url)) == (
        "m1",
        "k1",
        "http://127.0.0.1:1/v1/",
    )
    assert backend.sampling.temperature == 0.3
    assert backend.context_size == 777  # an explicit --ctx wins over the server's


@pytest.mark.parametrize(("reported", "context"), [(9000, 9000), (None, 4096)])
def test_without_ctx_the_servers_context_is_taken(server_context, reported, context):
    server_context.size = reported
    assert agent_cli.load_backend(agent_cli._parse([*API])).context_size == context


@pytest.fixture
def engine(monkeypatch):
    """Stand-ins for the local engine's pieces; records what each was given."""
    state = SimpleNamespace(calls={}, exits=[])
    model = SimpleNamespace(close="model.close", path=Path("m.gguf"), chat_format="deepseek")
    state.model = model

    def load_model(path, **kwargs):
        state.calls["load_model"] = (path, kwargs)
        return model

    def record(name, result):
        def call(*args, **kwargs):
            state.calls[name] = (args, kwargs)
            return result

        return call

    monkeypatch.setattr(ds4mlx.loader, "load_model", load_model)
    monkeypatch.setattr(ds4mlx.generation, "load_drafter", record("load_drafter", "drafter"))
    monkeypatch.setattr(
        ds4mlx.generation,
        "ChatService",
        record("ChatService", SimpleNamespace(model=model, max_context=321)),
    )
    monkeypatch.setattr(
        ds4mlx.generation.ranks, "lead", record("lead", SimpleNamespace(stop="lead.stop"))
    )
    monkeypatch.setattr(agent_cli, "prompt_cache_for", record("prompt_cache_for", "cache"))
    monkeypatch.setattr(agent_cli, "atexit", SimpleNamespace(register=state.exits.append))
    return state


def local_args(tmp_path, *flags: str):
    # parsed without _parse's checks, which would read the model file
    return agent_cli.build_parser().parse_args(
        ["-m", str(tmp_path / "m.gguf"), "-c", "321", "--top-k", "7", *flags]
    )


def test_a_local_backend_loads_the_model_and_its_service(engine, tmp_path):
    args = local_args(tmp_path, "--mtp")
    progress = print
    backend = agent_cli.load_backend(args, progress)
    assert isinstance(backend, LocalBackend)
    assert backend.sampling.top_k == 7
    path, loading = engine.calls["load_model"]
    assert path == args.model
    assert (loading["progress"], loading["ranks"], loading["weights_dtype"]) == (
        progress,
        None,
        args.weights_dtype,
    )
    assert not loading["experts"].stream
    (speculation, model), _ = engine.calls["load_drafter"]
    assert model is engine.model and speculation.kind.name == "NEXTN"
    (model, drafter, service_speculation), service = engine.calls["ChatService"]
    assert (drafter, service_speculation.kind.name) == ("drafter", "NEXTN")
    assert service == {"max_context": 321, "prompt_cache": "cache"}
    assert engine.exits == ["model.close"]  # no ranks: no followers to let go
    assert "lead" not in engine.calls


def test_ranks_get_no_prompt_cache_and_are_let_go_at_exit(engine, tmp_path):
    ranks = SimpleNamespace(rank=0)
    agent_cli.load_backend(local_args(tmp_path), ranks=ranks)
    assert engine.calls["load_model"][1]["ranks"] is ranks
    assert engine.calls["lead"][0] == (engine.model, ranks)
    assert engine.exits == ["model.close", "lead.stop"]
    assert engine.calls["ChatService"][1]["prompt_cache"] is None
    assert "prompt_cache_for" not in engine.calls


@pytest.fixture
def restored_signals():
    """The handlers of SIGTERM, SIGHUP and SIGALRM as they were before the test; no alarm."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    yield
    signal.alarm(0)
    for sig, handler in kept.items():
        signal.signal(sig, handler)


class StoppableAgent:
    def __init__(self):
        self.stops = 0

    def stop(self):
        self.stops += 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_run_and_arms_the_unwinding(restored_signals, sig):
    agent = StoppableAgent()
    received = agent_cli._stop_on_signals(agent)
    signal.getsignal(sig)(sig, None)
    assert (received, agent.stops) == ([sig], 1)
    assert signal.alarm(0) == agent_cli._SIGNAL_GRACE_SECONDS == 3
    with pytest.raises(SystemExit) as unwound:
        signal.getsignal(signal.SIGALRM)(signal.SIGALRM, None)
    assert unwound.value.code == 128 + sig


class PrintAgent:
    """An agent for ``_print_mode``: runs ``script`` (events, or a callable that raises)."""

    def __init__(self, script=(), instructions=None, states=None):
        self.script = script
        self.instructions = instructions
        self.states = states
        self.conversation = Conversation([{"role": "user", "content": "hi"}])
        self.toolbox = SimpleNamespace(closed=0)
        self.toolbox.close = lambda: setattr(self.toolbox, "closed", self.toolbox.closed + 1)
        self.prompts = []

    def stop(self):
        pass

    def run(self, prompt):
        self.prompts.append(prompt)
        for event in self.script:
            if callable(event):
                event()
            else:
                yield event


class SavingStore:
    def __init__(self):
        self.saved = []

    def save(self, conversation):
        self.saved.append(conversation)


@pytest.fixture
def print_mode(monkeypatch, restored_signals):
    """``_print_mode`` over ``state.agent`` (loaded by a stand-in backend, recorded)."""
    state = SimpleNamespace(agent=PrintAgent(), loaded=None, load_error=None)

    def load_backend(args, progress=None, ranks=None):
        if state.load_error is not None:
            raise state.load_error
        state.loaded = (progress, ranks)
        return "backend"

    def make_agent(args, backend, conversation=None, store=None):
        state.made = (backend, conversation, store)
        return state.agent

    monkeypatch.setattr(agent_cli, "load_backend", load_backend)
    monkeypatch.setattr(agent_cli, "make_agent", make_agent)

    def run(conversation=None, store=None, ranks=None):
        args = agent_cli._parse([*API, "--print", "the prompt"])
        return agent_cli._print_mode(args, conversation, store or SavingStore(), ranks)

    state.run = run
    return state


def test_print_mode_answers_closes_and_saves(print_mode, capsys):
    print_mode.agent.script = (RunFinished("answer", answer="yes"),)
    store = SavingStore()
    assert print_mode.run(store=store, ranks="ranks") == 0
    assert print_mode.loaded == (agent_cli.progress_line, "ranks")
    assert print_mode.made == ("backend", None, store)
    assert print_mode.agent.prompts == ["the prompt"]
    assert print_mode.agent.toolbox.closed == 1
    # saved after the run's end and once more when leaving
    assert store.saved == [print_mode.agent.conversation] * 2
    assert capsys.readouterr().out == "yes\n"


def test_a_backend_that_cannot_load_is_an_error(print_mode, capsys):
    print_mode.load_error = RuntimeError("no server")
    assert print_mode.run() == 1
    assert capsys.readouterr().err == "ds4-agent: error: no server\n"


def test_instructions_are_told_for_a_new_conversation_only(print_mode, capsys):
    print_mode.agent.instructions = SimpleNamespace(describe=lambda: "read AGENTS.md")
    assert print_mode.run() == 0
    assert capsys.readouterr().err == "ds4-agent: read AGENTS.md\n"
    assert print_mode.run(conversation=Conversation([])) == 0
    assert capsys.readouterr().err == ""


def test_a_resumed_conversation_restores_its_state(print_mode, capsys):
    restored = []

    def restore(agent, note):
        restored.append(agent)
        return note

    states = SimpleNamespace(restore=lambda agent: restore(agent, "state restored"))
    states.save = lambda agent: ""
    print_mode.agent.states = states
    assert print_mode.run() == 0  # a new conversation: nothing to restore
    assert restored == []
    assert print_mode.run(conversation=Conversation([])) == 0
    assert restored == [print_mode.agent]
    assert capsys.readouterr().err == "ds4-agent: state restored\n"
    states.restore = lambda agent: restore(agent, "")
    assert print_mode.run(conversation=Conversation([])) == 0
    assert capsys.readouterr().err == ""  # an empty note is not told


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_print_gives_its_exit_code(print_mode, sig):
    def send():
        signal.getsignal(sig)(sig, None)

    print_mode.agent.script = (send, RunFinished("cancelled"))
    assert print_mode.run() == 128 + sig
    assert signal.alarm(0) == 0  # the grace alarm is taken back when the run ends
    assert print_mode.agent.toolbox.closed == 1


def test_ctrl_c_during_print_is_exit_130(print_mode, capsys):
    def interrupt():
        raise KeyboardInterrupt

    print_mode.agent.script = (TurnFinished(None, 1), interrupt)
    store = SavingStore()
    assert print_mode.run(store=store) == agent_cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "ds4-agent: interrupted\n"
    assert print_mode.agent.toolbox.closed == 1
    assert len(store.saved) == 2  # after the turn, and when leaving


def test_print_mode_tells_event_notes_without_their_controls(capsys):
    events = (
        CompactionStarted(900, "auto"),
        FilesAttached([], ["a\x1b[2Jb"]),
        ToolStarted("1", ToolCall("bash", {"command": "echo \x1b]0;x\x07"})),
        RunFinished("answer"),
    )
    assert agent_cli.run_print(PrintAgent(events), "go") == 0
    assert capsys.readouterr().err.splitlines() == [
        "ds4-agent: compacting the context (auto; 900 tokens)",
        "ds4-agent: not attached: a\\x1b[2Jb",
        "ds4-agent: > bash echo \\x1b]0;x\\x07",
    ]


@pytest.mark.parametrize(("terminal", "shown"), [(False, "a\x1b[31mb"), (True, "a\\x1b[31mb")])
def test_the_answer_keeps_its_controls_for_a_pipe_only(capsys, monkeypatch, terminal, shown):
    monkeypatch.setattr(agent_cli.sys.stdout, "isatty", lambda: terminal)
    agent = PrintAgent((RunFinished("answer", answer="a\x1b[31mb"),))
    assert agent_cli.run_print(agent, "go") == 0
    assert capsys.readouterr().out == shown + "\n"


@pytest.fixture
def main_parts(monkeypatch, tmp_path):
    """``main``'s collaborators, recorded: ranks, the follower, print mode and the UI."""
    state = SimpleNamespace(ranks=None, rank_error=None, calls=[], agents=[], return_code=None)

    def join_ranks(distributed):
        state.calls.append(("join", distributed))
        if state.rank_error is not None:
            raise state.rank_error
        return state.ranks

    def follow_rank_0(front_end, options, ranks):
        state.calls.append(("follow", front_end, options.model, ranks))
        return 7

    def print_mode(args, conversation, store, ranks):
        state.calls.append(("print", args.print_prompt, conversation, store.folder, ranks))
        return 5

    def make_agent(args, backend, conversation=None, store=None):
        agent = PrintAgent()
        state.agents.append(agent)
        state.calls.append(("agent", backend, conversation, store.folder))
        return agent

    def load_backend(args, progress=None, ranks=None):
        return ("backend", ranks)

    class App:
        def __init__(self, load_agent, store, model_name):
            state.calls.append(("app", store.folder, model_name))
            self.load_agent = load_agent
            self.return_code = state.return_code

        def run(self):
            assert self.load_agent() is state.agents[0]

    monkeypatch.setattr(agent_cli, "join_ranks", join_ranks)
    monkeypatch.setattr(agent_cli, "follow_rank_0", follow_rank_0)
    monkeypatch.setattr(agent_cli, "_print_mode", print_mode)
    monkeypatch.setattr(agent_cli, "make_agent", make_agent)
    monkeypatch.setattr(agent_cli, "load_backend", load_backend)
    monkeypatch.setattr(ds4mlx.agent.app, "AgentApp", App)
    state.data = tmp_path / "data"
    state.flags = ["--data-dir", str(state.data), "--workspace", str(tmp_path)]
    return state


def test_main_runs_print_mode_with_the_resumed_conversation(main_parts):
    conversation = Conversation([{"role": "user", "content": "before"}])
    agent_cli.ConversationStore(main_parts.data).save(conversation, "old")
    code = agent_cli.main([*API, *main_parts.flags, "--resume", "old", "--print", "go"])
    assert code == 5
    join, (kind, prompt, resumed, folder, ranks) = main_parts.calls
    assert join == ("join", False)
    assert (kind, prompt, folder, ranks) == ("print", "go", main_parts.data, None)
    assert resumed.messages == conversation.messages


def test_main_refuses_a_conversation_that_cannot_be_resumed(main_parts, capsys):
    assert agent_cli.main([*API, *main_parts.flags, "--resume", "none", "--print", "go"]) == 1
    assert capsys.readouterr().err.startswith("ds4-agent: error: ")
    assert [call[0] for call in main_parts.calls] == ["join"]


def test_main_refuses_a_group_that_cannot_start(main_parts, capsys, tmp_path):
    main_parts.rank_error = DistributedError("not launched")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert agent_cli.main(["-m", str(model), "-c", "64", "--distributed", "--print", "x"]) == 1
    assert capsys.readouterr().err == "ds4-agent: error: not launched\n"
    assert main_parts.calls == [("join", True)]


@pytest.mark.parametrize(("rank", "kind"), [(1, "follow"), (0, "print")])
def test_only_rank_0_runs_the_agent(main_parts, tmp_path, rank, kind):
    main_parts.ranks = SimpleNamespace(rank=rank)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    argv = ["-m", str(model), "-c", "64", "--distributed", "--print", "x", *main_parts.flags]
    assert agent_cli.main(argv) == (7 if rank else 5)
    assert main_parts.calls[1][0] == kind
    if rank:
        assert main_parts.calls[1] == ("follow", "ds4-agent", str(model), main_parts.ranks)


def test_main_removes_stale_temporaries_first(main_parts):
    main_parts.data.mkdir()
    stale = main_parts.data / ".talk.abc.tmp"
    stale.write_text("{")
    os.utime(stale, (0, 0))  # left by a save interrupted long ago
    agent_cli.main([*API, *main_parts.flags, "--print", "go"])
    assert not stale.exists()


@pytest.mark.parametrize(("return_code", "code"), [(None, 0), (4, 4)])
def test_main_runs_the_ui_on_a_server_model(main_parts, return_code, code):
    main_parts.return_code = return_code
    assert agent_cli.main([*API, *main_parts.flags, "--api-model", "served"]) == code
    assert main_parts.calls[1] == ("app", main_parts.data, "served")
    assert main_parts.calls[2] == ("agent", ("backend", None), None, main_parts.data)
    assert main_parts.agents[0].toolbox.closed == 1


def test_the_ui_names_a_local_model_by_its_file(main_parts, tmp_path):
    model = tmp_path / "tiny-q8.gguf"
    model.write_bytes(b"")
    assert agent_cli.main(["-m", str(model), "-c", "64", *main_parts.flags]) == 0
    assert main_parts.calls[1] == ("app", main_parts.data, "tiny-q8")


def test_leaving_print_mode_saves_the_model_state(print_mode, capsys):
    print_mode.agent.states = SimpleNamespace(save=lambda agent: "state saved")
    print_mode.agent.script = (RunFinished("answer"),)
    assert print_mode.run() == 0
    assert capsys.readouterr().err == "ds4-agent: state saved\n"


def test_an_empty_print_prompt_is_still_print_mode(main_parts):
    assert agent_cli.main([*API, *main_parts.flags, "--print", ""]) == 5
    assert main_parts.calls[1][:2] == ("print", "")


def test_a_local_model_without_ctx_gets_its_own_context(monkeypatch, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    asked = []

    def model_context(args, fallback):
        asked.append(fallback)
        return 5000

    monkeypatch.setattr(agent_cli, "model_context", model_context)
    assert (agent_cli._parse(["-m", str(model)]).ctx, asked) == (5000, [4096])
    assert agent_cli._parse(["-m", str(model), "-c", "99"]).ctx == 99
    assert agent_cli._parse([*API]).ctx == 4096  # a server's context is asked at load time
    assert asked == [4096]


def test_a_drafter_is_checked_before_a_local_model_loads(capsys, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")  # no header: --mtp's draft block cannot be found
    with pytest.raises(SystemExit) as refused:
        agent_cli._parse(["-m", str(model), "-c", "64", "--mtp"])
    assert refused.value.code == 2
    assert "GGUF header needs 24" in capsys.readouterr().err
    assert agent_cli._parse([*API, "--mtp"]).mtp  # a server drafts (or not) by itself
