"""``ds4-agent --api-base`` against a real ``ds4-server`` process serving the shipped tiny model:
the agent's OpenAI backend streams the model's tool call, runs it, and sends the result back."""

from __future__ import annotations

from ds4mlx.bench.server import server_process
from ds4mlx.cli import agent as cli

import httpx
import pytest


@pytest.mark.skipif(not cli.DEFAULT_MODEL.is_file(), reason="assets/ds4-tiny.gguf not built yet")
def test_the_agent_works_through_ds4_server(workspace, tmp_path, capsys):
    # Two batched sessions: the agent's requests run through the batching scheduler too.
    with server_process(str(cli.DEFAULT_MODEL), ["--batched-session", "2"]) as url:
        code = cli.main(
            [
                "--api-base",
                f"{url}/v1",
                "--print",
                "List the files.",
                "--workspace",
                str(workspace),
                "--data-dir",
                str(tmp_path / "data"),
                "--max-steps",
                "3",
                "-n",
                "128",
            ]
        )
        stats = httpx.get(f"{url}/stats", timeout=10).json()
    out, err = capsys.readouterr()
    assert "> list" in err, err  # the model's call came through the server and ran
    assert code == 0 and out.strip()
    # One request per agent step; the one after the tool call carried its result.
    assert stats["completed"] >= 2 and stats["failed"] == 0
