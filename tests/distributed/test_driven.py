"""Rank 0 leads, the other ranks follow (``ds4mlx.distributed.driven``), for the server and
the agent: the announcement protocol in one process over a recorded wire, then real 2-rank
``ds4-agent --distributed`` and ``ds4-server --distributed`` runs on loopback."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path

from ds4mlx.distributed.driven import Conductor, DrivenSession, Follower, Op, lead
from ds4mlx.distributed.launch import free_port_block, launch_local
from ds4mlx.engine.generate import TokenEvent
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session, feed_batch
from ds4mlx.generation import generate
from ds4mlx.loader import load_model
from ds4mlx.speculation import SpeculationConfig, load_drafter
from ds4mlx.speculation.config import DrafterKind

import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY = ASSETS / "ds4-tiny.gguf"
DSPARK = ASSETS / "ds4-tiny-dspark.gguf"
LAUNCH_TIMEOUT_S = 420


class Wire:
    """What rank 0 shares, in order: a stand-in for all_sum between a leader and a follower
    that run one after the other in this process."""

    def __init__(self):
        self.arrays: deque[np.ndarray] = deque()

    def end(self, rank: int) -> WireEnd:
        return WireEnd(self, rank)


class WireEnd:
    size = 2

    def __init__(self, wire: Wire, rank: int):
        self.wire, self.rank = wire, rank

    def share_ints(self, values, n: int) -> np.ndarray:
        if self.rank == 0:
            shared = np.asarray(values, np.int32)
            assert shared.shape == (n,)
            self.wire.arrays.append(shared)
            return shared
        shared = self.wire.arrays.popleft()
        assert shared.shape == (n,), "the follower expected another message length"
        return shared


@pytest.fixture(scope="module")
def leader_and_follower():
    wire = Wire()
    leader, follower = load_model(TINY), load_model(TINY)
    conductor = lead(leader, wire.end(0))
    return leader, conductor, Follower(follower, wire.end(1)), wire


def test_a_follower_replays_every_session_operation(leader_and_follower):
    leader, conductor, follower, wire = leader_and_follower
    a, b = leader.new_session(), leader.new_session()
    assert isinstance(a, DrivenSession)
    a.feed(list(range(40, 80)))
    snap = a.snapshot()
    a.feed([5, 6, 7])
    a.truncate(41)
    a.restore(snap)
    a.feed_hidden([8, 9], capture_layers=[2, 4])
    b.feed([11, 12, 13])
    feed_batch([a, b], [21, 22])
    with pytest.raises(ValueError):
        a.feed([])  # refused before anything is announced
    del snap
    gc.collect()
    conductor.stop()
    assert follower.run() == 10
    assert not wire.arrays
    copies = [follower.sessions[a.key], follower.sessions[b.key]]
    assert [c.tokens for c in copies] == [a.tokens, b.tokens]
    assert follower.snapshots == {}, "the dropped snapshot was not freed"
    # The replayed states continue exactly as the leader's (Session's own feed: the
    # followers are gone).
    for mine, theirs in zip([a, b], copies, strict=True):
        np.testing.assert_array_equal(np.array(Session.feed_mx(mine, [30])), theirs.feed([30]))


def test_a_speculative_generation_is_replayed_token_for_token():
    wire = Wire()
    leader, follower_model = load_model(TINY), load_model(TINY)
    conductor = lead(leader, wire.end(0))
    config = SpeculationConfig(kind=DrafterKind.DSPARK, support_path=DSPARK)
    drafter = load_drafter(config, leader)
    session = leader.new_session()
    prompt = leader.tokenizer.encode("def read_config(path):\n")
    events = list(generate(session, prompt, 24, SamplingOptions(), drafter, config))
    generated = [e.token for e in events if isinstance(e, TokenEvent)]
    conductor.stop()
    follower = Follower(follower_model, wire.end(1))
    follower.run()
    assert follower.sessions[session.key].tokens == session.tokens
    # The last token is sampled, never fed.
    assert session.tokens == prompt + generated[:-1]


def test_a_stopped_conductor_refuses_to_announce():
    wire = Wire()
    conductor = Conductor(wire.end(0))
    conductor.stop()
    conductor.stop()  # once only
    assert len(wire.arrays) == 1
    with pytest.raises(RuntimeError, match="stopped"):
        conductor.announce(Op.FEED, 1, payload=[1])
    with pytest.raises(ValueError, match="only rank 0 conducts"):
        Conductor(wire.end(1))


def agent_command(workspace: Path, data: Path, *extra: str) -> list[str]:
    return [
        "--print",
        "List the workspace.",
        "--workspace",
        str(workspace),
        "--data-dir",
        str(data),
        *extra,
    ]


def test_two_rank_agent_answers_as_one_process(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.py").write_text("print('hi')\n")
    one = launch_local(
        1, "ds4mlx.cli.agent", agent_command(workspace, tmp_path / "d1"), timeout=LAUNCH_TIMEOUT_S
    )
    two = launch_local(
        2,
        "ds4mlx.cli.agent",
        agent_command(workspace, tmp_path / "d2", "--distributed"),
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert "> list ." in two.stderr  # the model's own tool call ran
    assert two.stdout == one.stdout and one.stdout.strip()
    followed = [line for line in two.stderr.splitlines() if "rank 1: done after" in line]
    assert followed and int(followed[0].split("after ")[1].split()[0]) > 0


class RunningServer:
    """``ds4-server`` (under mlx.launch for several ranks) on a free port until ``stop``."""

    def __init__(self, ranks: int, *flags: str):
        self.port = free_port_block(1)
        command = [sys.executable, "-m", "ds4mlx.cli.server", "--port", str(self.port), *flags]
        if ranks > 1:
            command = [
                "mlx.launch",
                "--backend",
                "ring",
                "-n",
                str(ranks),
                "--hosts",
                "127.0.0.1",
                "--starting-port",
                str(free_port_block(ranks)),
                "--",
                *command,
                "--distributed",
            ]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.proc.communicate()[1][-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/models", timeout=5)
                return
            except OSError:
                time.sleep(1)
        self.stop()
        raise AssertionError("server did not come up")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat(self, text: str) -> str:
        body = {
            "model": "ds4-tiny",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 24,
            "temperature": 0,
        }
        request = urllib.request.Request(
            f"{self.url}/chat/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=LAUNCH_TIMEOUT_S) as response:
            return json.load(response)["choices"][0]["message"]["content"]

    def stop(self) -> str:
        """Ctrl-C for the server processes (not the launcher, which does not forward it):
        rank 0 shuts down and stops the followers, which ignore the signal. Returns stderr."""
        for pid in self._ranks():
            os.kill(pid, signal.SIGINT)
        try:
            return self.proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.communicate()[1]

    def _ranks(self) -> list[int]:
        """The server processes: this process group's Python processes other than mlx.launch
        (with one rank, the server itself)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (
                int(fields[2]) == self.proc.pid
                and b"ds4mlx.cli.server" in command
                and b"mlx.launch" not in command
            ):
                pids.append(int(entry.name))
        return pids


def serve(ranks: int, prompts: list[str]) -> tuple[list[str], list[str], str]:
    """(answers one at a time with DSpark, answers to concurrent requests, stderr)."""
    from concurrent.futures import ThreadPoolExecutor

    server = RunningServer(ranks, "--mtp-model", str(DSPARK), "--dspark", "--batched-session", "2")
    try:
        alone = [server.chat(p) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(server.chat, prompts))
    finally:
        stderr = server.stop()
    return alone, together, stderr


def test_two_rank_server_answers_as_one_process():
    prompts = ["Write a haiku about code.", "What is a list?"]
    one_alone, one_together, _ = serve(1, prompts)
    two_alone, two_together, stderr = serve(2, prompts)
    assert two_alone == one_alone
    assert two_together == one_together
    assert "rank 1: done after" in stderr, stderr[-2000:]
