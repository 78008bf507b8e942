"""`grpolab serve` bad input: exit 2 with a message naming the flag, before any model loads."""

from __future__ import annotations

import re
import socket

import pytest

from grpolab.cli import main
from grpolab.serve.command import is_loopback


def test_port_in_use_is_exit_2_naming_the_port(tiny_model_dir, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port} on 127.0.0.1 cannot be bound" in err and "in use" in err


def test_missing_checkpoint_is_exit_2(tmp_path, capsys):
    assert main(["serve", "--hf-checkpoint", str(tmp_path / "nope"), "--port", "0"]) == 2
    assert f"--hf-checkpoint: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["serve", "--hf-checkpoint", str(tmp_path / "empty"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"grpolab serve: error: --hf-checkpoint: {tmp_path / 'empty'} ")


def test_non_loopback_host_needs_api_key(tiny_model_dir, capsys, monkeypatch):
    monkeypatch.delenv("GRPOLAB_API_KEY", raising=False)
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not a loopback address; it needs an API key (--api-key-file PATH, " in err
    assert "$GRPOLAB_API_KEY or --api-key)" in err
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--host", "0.0.0.0", "--api-key", ""]) == 2
    assert "or --api-key) (an empty one was given)" in capsys.readouterr().err


def test_the_key_comes_from_a_file_or_the_environment_too(tmp_path, monkeypatch):
    """`--api-key KEY` shows in every process listing: a file or GRPOLAB_API_KEY keep it out."""
    from grpolab.cli import build_parser
    from grpolab.serve.command import redacted_command, resolve_api_key

    monkeypatch.delenv("GRPOLAB_API_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text("  s3cret-from-file \n")
    parse = lambda *a: build_parser().parse_args(["serve", "--hf-checkpoint", "m", *a])  # noqa: E731
    assert resolve_api_key(parse("--api-key-file", str(key_file))) == "s3cret-from-file"
    assert resolve_api_key(parse(), {"GRPOLAB_API_KEY": "from-env"}) == "from-env"
    assert resolve_api_key(parse("--api-key", "flag"), {"GRPOLAB_API_KEY": "from-env"}) == "flag"
    assert (
        resolve_api_key(parse("--api-key-file", str(key_file)), {"GRPOLAB_API_KEY": "env"})
        == "s3cret-from-file"
    )
    assert resolve_api_key(parse(), {}) is None
    bad = [
        (
            ("--api-key", "k", "--api-key-file", str(key_file)),
            {},
            "--api-key and --api-key-file: give one of them",
        ),
        (
            ("--api-key-file", str(tmp_path / "absent")),
            {},
            f"--api-key-file {tmp_path / 'absent'}: cannot read it",
        ),
        (("--api-key-file", str(tmp_path)), {}, f"--api-key-file {tmp_path}: cannot read it"),
        ((), {"GRPOLAB_API_KEY": " "}, "$GRPOLAB_API_KEY is set but empty"),
    ]
    (tmp_path / "empty").write_text("\n")
    bad.append((("--api-key-file", str(tmp_path / "empty")), {}, "the file is empty"))
    for flags, env, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            resolve_api_key(parse(*flags), env)
    assert redacted_command(["grpolab", "serve", "--api-key", "k1", "--api-key=k2", "--port", "1"]) == (
        "grpolab serve --api-key REDACTED --api-key=REDACTED --port 1"
    )


def test_a_bad_key_source_is_exit_2_and_a_key_in_the_environment_counts(
    tiny_model_dir, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("GRPOLAB_API_KEY", "")
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir)]) == 2
    assert "$GRPOLAB_API_KEY is set but empty" in capsys.readouterr().err
    monkeypatch.setenv("GRPOLAB_API_KEY", "from-env")
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    port = taken.getsockname()[1]
    try:  # past the host rule (the key counts) to the port check, before any model loads
        assert (
            main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--host", "0.0.0.0", "--port", str(port)])
            == 2
        )
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert f"--port {port} on 0.0.0.0 cannot be bound" in err and "from-env" not in err


def test_missing_flag_and_bad_dtype(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve"])
    assert e.value.code == 2 and "--hf-checkpoint" in capsys.readouterr().err
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--port", "0", "--dtype", "int3"]) == 2
    assert "--dtype" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device must be cpu, cuda or cuda:N, got 'gpu'"),
        ("cuda:x", "--device must be cpu, cuda or cuda:N, got 'cuda:x'"),
        ("cuda:4096", "--device cuda:4096: this "),  # no CUDA here, or not that many devices
    ],
)
def test_bad_device_is_exit_2_naming_it(tiny_model_dir, capsys, device, message):
    """Was a raw torch traceback, exit 1, after the model loaded."""
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--port", "0", "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpolab serve: error: ") and message in err and "Traceback" not in err


LOOPBACK = [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True)]
OTHER = [("0.0.0.0", False), ("10.1.2.3", False)]


@pytest.mark.parametrize(("host", "loop"), LOOPBACK + OTHER)
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


@pytest.mark.parametrize("port", ["-3", "99999", "http"])
def test_port_out_of_range_is_exit_2(tiny_model_dir, capsys, port):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--port", port])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--port must be" in err and "0..65535" in err and "Traceback" not in err


def test_num_threads_below_one_is_exit_2(tiny_model_dir, capsys):
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--port", "0", "--num-threads", "0"]) == 2
    assert "grpolab serve: error: --num-threads must be >= 1, got 0" in capsys.readouterr().err


def test_a_launched_fleet_gives_its_engines_the_runs_thread_count(tmp_path, monkeypatch):
    """On 2 cores, engines on torch's default 2 threads beside the router and the trainer made a rollout
    through the router 2.15x the in-process one; with the run's 1 thread, 1.48x (bench_http_engine.py)."""
    pytest.importorskip("sglang_router")
    from grpolab.core.engine import fleet

    spawned: list[list[str]] = []

    class Spawned(Exception):
        pass

    def record(name, argv, log_path):
        spawned.append(argv)
        raise Spawned

    monkeypatch.setattr(fleet, "_spawn", record)
    for threads, expected in ((3, ["--num-threads", "3"]), (None, [])):
        with pytest.raises(Spawned):
            fleet.Fleet.launch(checkpoint="m", num_engines=1, run_dir=tmp_path, num_threads=threads)
        argv = spawned[-1]
        assert argv[argv.index("serve") :][-len(expected) - 1 :] == ["auto", *expected]


@pytest.mark.parametrize("wait", ["-5", "nan", "inf"])
def test_batch_wait_must_be_finite_and_not_negative(tiny_model_dir, capsys, wait):
    """nan and inf were accepted, and then every /generate hung."""
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--batch-wait-ms", wait]) == 2
    assert "--batch-wait-ms must be a finite number >= 0" in capsys.readouterr().err


def test_an_empty_served_model_name_is_exit_2(tiny_model_dir, capsys):
    assert main(["serve", "--hf-checkpoint", str(tiny_model_dir), "--served-model-name", " "]) == 2
    assert "--served-model-name must not be empty" in capsys.readouterr().err
