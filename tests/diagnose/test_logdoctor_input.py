"""What `grpolab diagnose log` accepts: text logs and run directories; compressed, UTF-16 and binary files
are refused with the command that makes a text log of them; whole-second --interval/--window; the
`grpolab diagnose` help and error texts."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.diagnose.common.wording import display_path, plural
from grpolab.diagnose.logdoctor import main
from grpolab.diagnose.logdoctor.scan import scan_file
from grpolab.diagnose.logdoctor.sniff import NotATextLog, not_text_reason

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "fixtures" / "logs" / "miles_ray_oom.log"


def _variants(tmp_path: Path) -> dict[str, Path]:
    text = LOG.read_bytes()
    out = {
        "gzip": tmp_path / "train.log.gz",
        "bzip2": tmp_path / "train.log.bz2",
        "xz": tmp_path / "train.log.xz",
        "utf16": tmp_path / "utf16.log",
        "binary": tmp_path / "weights.bin",
    }
    out["gzip"].write_bytes(gzip.compress(text))
    out["bzip2"].write_bytes(bz2.compress(text))
    out["xz"].write_bytes(lzma.compress(text))
    out["utf16"].write_bytes(text.decode().encode("utf-16"))  # with a byte-order mark, as PowerShell writes
    out["binary"].write_bytes(os.urandom(20_000))
    return out


def test_compressed_utf16_and_binary_files_are_refused(tmp_path: Path, capsys) -> None:
    files = _variants(tmp_path)
    expected = {
        "gzip": f"gzip-compressed: decompress it first, e.g. zcat {files['gzip']} > {tmp_path / 'train.log'})",
        "bzip2": f"bzip2-compressed: decompress it first, e.g. bzcat {files['bzip2']} > {tmp_path / 'train.log'}",
        "xz": f"xz-compressed: decompress it first, e.g. xzcat {files['xz']} > {tmp_path / 'train.log'}",
        "utf16": f"UTF-16 text: convert it first, e.g. iconv -f UTF-16 -t UTF-8 {files['utf16']} > ",
        "binary": "binary data: ",
    }
    for kind, path in files.items():
        with pytest.raises(NotATextLog) as info:
            scan_file(path)
        assert info.value.strerror.startswith("not a text log (") and expected[kind] in info.value.strerror
        assert main([str(path)]) == 2  # cannot read: named once, on stderr; the report's summary counts it
        captured = capsys.readouterr()
        assert captured.err.count(f"cannot read {path}: not a text log (") == 1
        assert "cannot read" not in captured.out and str(path) not in captured.out
        assert captured.out.rstrip().endswith("; 1 file could not be read (named on stderr)")
    # the same log as text is read, and so is a UTF-16 log once converted
    assert main([str(LOG)]) == 1
    converted = tmp_path / "converted.log"
    converted.write_text(files["utf16"].read_bytes().decode("utf-16"))
    assert {f.rule for f in scan_file(converted).findings} == {"ray_oom"}


def test_what_still_counts_as_text() -> None:
    text = LOG.read_bytes()
    assert not_text_reason(text, "x.log") is None
    assert not_text_reason(b"", "empty.log") is None
    # a log truncated in place while its writer kept its offset starts with zeros; a crash can leave a block
    assert not_text_reason(b"\0" * 50_000 + text[:10_000], "x.log") is None
    assert not_text_reason(text[:5000] + b"\0" * 4096 + text[5000:20000], "x.log") is None
    assert not_text_reason(text[:5000] + b"\0" + text[5000:20000], "x.log") is None  # one stray NUL
    # UTF-16 without a byte-order mark, either byte order
    assert "UTF-16" in (not_text_reason(text[:4000].decode().encode("utf-16-le"), "x.log") or "")
    assert "UTF-16" in (not_text_reason(text[:4000].decode().encode("utf-16-be"), "x.log") or "")


def test_a_run_directory_stands_for_its_console_log(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "console.log").write_bytes(LOG.read_bytes())
    assert main([str(run)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{run / 'console.log'} (") and "ERROR   ray_oom:" in out
    other = tmp_path / "other"
    other.mkdir()
    assert main([str(other), str(run)]) == 2  # the other directory is named; the run is still scanned
    captured = capsys.readouterr()
    assert (
        f"cannot read {other}: a directory without console.log, router.log or engines/<i>.log: give a log "
        "file or a grpolab run directory" in captured.err
    )
    assert "ERROR   ray_oom:" in captured.out


def test_paths_in_messages_are_normalised(tmp_path: Path, capsys, monkeypatch) -> None:
    """`diagnose log runs/x/` names `runs/x/console.log` (it printed `runs/x//console.log`); a file given
    as `logs//a.log` and a missing `gone/` are named without the doubled or trailing slash."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "console.log").write_bytes(LOG.read_bytes())
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_bytes(LOG.read_bytes())
    assert main(["runs/x/", "runs//x", "logs//a.log", "gone/"]) == 2
    captured = capsys.readouterr()
    assert "//" not in captured.out + captured.err
    assert captured.out.count("runs/x/console.log (") == 2 and "runs/x/console.log:" in captured.out
    assert "logs/a.log (" in captured.out and "logs/a.log:" in captured.out
    assert "cannot read gone: No such file or directory" in captured.err
    assert display_path("runs/x//") == "runs/x" and display_path("../a/./b") == "../a/b"


def test_interval_and_window_are_whole_seconds(tmp_path: Path, capsys) -> None:
    assert main(["--interval", "30.0", "--window", "60.0", str(LOG)]) == 1  # whole numbers given as floats
    capsys.readouterr()
    assert main(["--interval", "30.5", str(LOG)]) == 2
    assert (
        "--interval must be a whole number of seconds for the log doctor, got 30.5" in capsys.readouterr().err
    )


def test_counts_are_worded_for_one(tmp_path: Path, capsys) -> None:
    assert [plural(1, "line"), plural(2, "line"), plural(12_345, "line"), plural(0, "check")] == [
        "1 line",
        "2 lines",
        "12,345 lines",
        "0 checks",
    ]
    one = tmp_path / "one.log"
    one.write_text("all good\n")
    assert main([str(one)]) == 0
    assert f"{one} (9 B, 1 line): no known failure signature" in capsys.readouterr().out
    # a few 503s that never reach the limit: no check struck, and the title says so plainly
    few = tmp_path / "few.log"
    few.write_text("".join(f"[2026-01-01 10:00:0{n}] Error: 503 Service Unavailable\n" for n in range(1, 4)))
    (bursts,) = scan_file(few).findings
    assert bursts.rule == "engine_503_bursts"
    assert "not met (no check counted more than 100; it needs 10 in a row)" in bursts.title


def test_diagnose_help_and_errors() -> None:
    def grpolab(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "grpolab", *argv], capture_output=True, text=True, timeout=120
        )

    bare = grpolab("diagnose")
    assert bare.returncode == 2
    assert "grpolab diagnose: error: the following arguments are required: {hang,log,gpu}" in bare.stderr
    for command, words in (
        ("gpu", "Print one reading of every NVIDIA GPU"),
        ("log", "Scan logs (grpolab console.log, router.log, engines/<i>.log or a whole run directory"),
        ("hang", "Take py-spy stacks of every rank of a run"),
    ):
        help_text = grpolab("diagnose", command, "--help").stdout
        assert words in " ".join(help_text.split()), help_text
    assert "SIGKILL after --grace-seconds" in " ".join(grpolab("watchdog", "--help").stdout.split())
