"""``ds4-agent``'s command line without a model: flag checks and defaults, the agent the flags
build, the default context, the conversation to resume, and ``--print``'s output and exit code
for each way a run ends."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import ds4mlx.load_plan
import ds4mlx.memory
from ds4mlx.agent.loop import (
    PermissionRequest,
    RunFinished,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from ds4mlx.agent.tools import ToolResult
from ds4mlx.cli import agent as agent_cli
from ds4mlx.cli.options import DEFAULT_MODEL
from ds4mlx.engine.chat.events import ToolCall
from ds4mlx.generation import GGUFError

import pytest


def test_conversations_live_under_the_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert agent_cli.default_data_dir() == tmp_path / "ds4mlx" / "conversations"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert agent_cli.default_data_dir() == tmp_path / "home/.local/share/ds4mlx/conversations"


def parse(*flags: str) -> argparse.Namespace:
    return agent_cli._parse(["--api-base", "http://127.0.0.1:1/v1", *flags])


def test_defaults_of_the_agent_flags():
    args = parse()
    assert (args.print_prompt, args.continue_last, args.resume, args.workspace) == (
        None,
        False,
        None,
        ".",
    )
    assert (args.yolo, args.n_predict, args.max_steps, args.think, args.bash_timeout) == (
        False,
        1024,
        20,
        False,
        60.0,
    )
    assert (args.api_model, args.ctx, args.ctx_given) == ("default", 4096, False)


def test_an_explicit_context_is_kept():
    args = parse("-c", "100")
    assert (args.ctx, args.ctx_given) == (100, True)


def usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        agent_cli._parse(argv)
    assert caught.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-n", "0"], "--n-predict must be positive, got 0"),
        (["--max-steps", "0"], "--max-steps must be positive, got 0"),
        (["--max-steps", "-2"], "--max-steps must be positive, got -2"),
        (["--bash-timeout", "0"], "--bash-timeout must be positive, got 0.0"),
        (["--distributed"], "--distributed runs the model in this group of processes"),
        (["--mtp-model", "d.gguf"], "--mtp-model given without"),
        (["-p", "x", "--continue", "--resume", "a"], "not allowed with argument"),
    ],
)
def test_bad_agent_flags_are_usage_errors(capsys, flags, message):
    argv = ["--api-base", "http://127.0.0.1:1/v1", *flags]
    assert message in usage_error(capsys, argv)


def test_a_missing_model_file_is_named(capsys, tmp_path):
    missing = tmp_path / "none.gguf"
    err = usage_error(capsys, ["-m", str(missing)])
    assert f"model file {missing} not found" in err and "train_tiny" not in err


def test_the_missing_default_model_says_how_it_is_built(capsys, monkeypatch):
    monkeypatch.setattr(agent_cli.Path, "is_file", lambda self: False)
    err = usage_error(capsys, [])
    assert f"model file {DEFAULT_MODEL} not found (the tiny model is built by" in err


@pytest.fixture
def plan(monkeypatch):
    """Stand-in memory plans: ``plan.result`` is what plan_model returns (or raises)."""
    state = SimpleNamespace(result=None, memory=None, streamed=None)

    def plan_model(path, mode):
        if isinstance(state.result, Exception):
            raise state.result
        return state.result

    monkeypatch.setattr(ds4mlx.load_plan, "plan_model", plan_model)
    monkeypatch.setattr(ds4mlx.memory, "available_memory_bytes", lambda: state.memory)
    return state


def context_args(*flags: str) -> argparse.Namespace:
    return agent_cli.build_parser().parse_args(["-m", str(DEFAULT_MODEL), *flags])


def fits_plan(trained: int, fits: int) -> SimpleNamespace:
    def context_that_fits(memory, streamed):
        return fits if not streamed else fits * 2

    return SimpleNamespace(trained_ctx=trained, context_that_fits=context_that_fits)


def test_the_default_context_is_the_models_capped_by_memory(plan):
    plan.result = fits_plan(trained=8192, fits=3000)
    assert agent_cli.model_context(context_args(), 4096) == 8192  # memory unknown
    plan.memory = 2**30
    assert agent_cli.model_context(context_args(), 4096) == 3000
    assert agent_cli.model_context(context_args("--ssd-stream"), 4096) == 6000
    plan.result = fits_plan(trained=8192, fits=0)  # does not fit at all: loading says why
    assert agent_cli.model_context(context_args(), 4096) == 4096


@pytest.mark.parametrize("error", [GGUFError("bad"), OSError("gone"), ValueError("odd")])
def test_a_model_without_a_plan_gets_the_fallback_context(plan, error):
    plan.result = error
    assert agent_cli.model_context(context_args(), 1234) == 1234


class Store:
    def load(self, name):
        return f"loaded {name}"

    def latest(self, workspace):
        return f"latest of {workspace}"


def test_the_conversation_to_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def args(**given):
        base = {"resume": None, "continue_last": False, "workspace": "."}
        return argparse.Namespace(**base | given)

    assert agent_cli.resumed_conversation(args(resume="talk"), Store()) == "loaded talk"
    latest = agent_cli.resumed_conversation(args(continue_last=True), Store())
    assert latest == f"latest of {tmp_path.resolve()}"  # the folder, not "."
    assert agent_cli.resumed_conversation(args(), Store()) is None


@pytest.mark.parametrize(("ctx", "chars"), [(100, 100), (16000, 16000), (20000, 16000)])
def test_the_agent_the_flags_build(tmp_path, ctx, chars):
    args = parse(
        *("--workspace", str(tmp_path), "--bash-timeout", "7", "--max-steps", "3"),
        *("-n", "99", "--think", "--yolo", "-c", str(ctx)),
    )
    agent = agent_cli.make_agent(args, backend=None)
    try:
        assert agent.toolbox.workspace.root == tmp_path.resolve()
        assert (agent.toolbox.bash_timeout, agent.toolbox.max_output_chars) == (7.0, chars)
        settings = agent.settings
        assert (settings.max_steps, settings.max_tokens, settings.thinking) == (3, 99, True)
        assert agent.permissions.yolo and agent.states is None
    finally:
        agent.toolbox.close()


def test_states_are_kept_only_with_a_store_and_a_disk_folder(tmp_path):
    args = parse("--workspace", str(tmp_path), "--kv-disk-dir", str(tmp_path / "kv"))
    with_store = agent_cli.make_agent(args, None, store=agent_cli.ConversationStore(tmp_path))
    without = agent_cli.make_agent(args, None)
    no_folder = agent_cli.make_agent(
        parse("--workspace", str(tmp_path)), None, store=agent_cli.ConversationStore(tmp_path)
    )
    try:
        assert with_store.states is not None
        assert without.states is None and no_folder.states is None
    finally:
        for agent in (with_store, without, no_folder):
            agent.toolbox.close()


class ScriptedAgent:
    def __init__(self, *events):
        self.events = events
        self.conversation = SimpleNamespace(is_empty=True)

    def run(self, prompt):
        yield from self.events


CALL = ToolCall("bash", {"command": "ls"})


@pytest.mark.parametrize(
    ("finished", "code", "out", "err"),
    [
        (RunFinished("answer", answer="done\n"), 0, "done\n\n", ""),
        (RunFinished("answer"), 0, "", ""),
        (RunFinished("cancelled", answer="part"), 0, "part\n", ""),
        (RunFinished("error", error="boom"), 1, "", "ds4-agent: error: boom\n"),
        (
            RunFinished("context_full", error="the context is full"),
            1,
            "",
            "ds4-agent: the context is full; give a larger -c/--ctx, or leave out "
            "--continue/--resume to start a new conversation\n",
        ),
        (RunFinished("step_limit", error="20 steps"), 3, "", "ds4-agent: 20 steps\n"),
    ],
)
def test_print_mode_exit_code_and_output_for_each_end(capsys, finished, code, out, err):
    assert agent_cli.run_print(ScriptedAgent(finished), "go") == code
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (out, err)
    assert agent_cli.EXIT_STEP_LIMIT == 3 and agent_cli.EXIT_INTERRUPTED == 130


def test_print_mode_reports_tools_on_stderr(capsys):
    events = (
        ToolStarted("1", CALL),
        PermissionRequest("1", CALL),
        ToolFinished("1", CALL, ToolResult("first line\nsecond\nthird")),
        ToolFinished("2", CALL, ToolResult("x" * 130)),
        ToolFinished("3", CALL, ToolResult("")),
        RunFinished("answer", answer="ok"),
    )
    assert agent_cli.run_print(ScriptedAgent(*events), "go") == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("ds4-agent: > ")
    assert lines[1] == (
        "ds4-agent: denied bash (--print asks nobody; pass --yolo to allow write, edit and bash)"
    )
    assert lines[2:] == [
        "ds4-agent:   first line (+2 lines)",
        "ds4-agent:   " + "x" * 120,
        "ds4-agent:   ",
    ]


class CountingStore:
    def __init__(self):
        self.saved = 0

    def save(self, conversation):
        self.saved += 1


def test_print_mode_saves_after_every_turn_and_at_the_end():
    agent = ScriptedAgent(
        TurnFinished(None, 10), TurnFinished(None, 20), RunFinished("answer", answer="ok")
    )
    agent.conversation = SimpleNamespace(is_empty=False)
    store = CountingStore()
    assert agent_cli.run_print(agent, "go", store) == 0
    assert store.saved == 3
    agent.conversation = SimpleNamespace(is_empty=True)
    agent_cli._save(agent, store)
    assert store.saved == 3  # an empty conversation is not saved


def test_a_conversation_that_cannot_be_saved_is_reported(capsys):
    class Failing:
        def save(self, conversation):
            raise OSError("disk full")

    agent = ScriptedAgent()
    agent.conversation = SimpleNamespace(is_empty=False)
    agent_cli._save(agent, Failing(), leaving=True)
    assert capsys.readouterr().err == "ds4-agent: could not save the conversation: disk full\n"


def test_leaving_saves_the_model_state_where_states_are_kept(capsys):
    agent = ScriptedAgent()
    agent.conversation = SimpleNamespace(is_empty=False)
    agent.states = SimpleNamespace(save=lambda agent: "state saved")
    agent_cli._save(agent, CountingStore())
    assert capsys.readouterr().err == ""
    agent_cli._save(agent, CountingStore(), leaving=True)
    assert capsys.readouterr().err == "ds4-agent: state saved\n"
