"""``collect`` takes nothing on trust (issue 14, class 7): links, devices, bombs, bad entries."""

from __future__ import annotations

import os
import stat
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import nbformat
import pytest

from grader.logistics import collect

A = "01_first_kernel"
NB = "first_kernel.ipynb"
NOTEBOOK = nbformat.v4.writes(nbformat.v4.new_notebook())
WHEN = (2026, 1, 2, 12, 30, 0)


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "course"
    (root / "source" / A).mkdir(parents=True)
    (root / "source" / A / "first_kernel.py").write_text("")
    return root


def _collect(root, path, **kw) -> dict:
    return collect.collect(root, path, log=lambda *a: None, **kw)


def _stamp(root, student) -> str:
    return (root / "submitted" / student / A / "timestamp.txt").read_text()


def _zip(path: Path, entries) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data, *mode in entries:
            info = zipfile.ZipInfo(name, date_time=WHEN)
            info.compress_type = zipfile.ZIP_DEFLATED
            if mode:
                info.external_attr = mode[0] << 16
            zf.writestr(info, data)
    return path


def test_layout_skips_and_archive_dates(root, tmp_path):
    z = _zip(tmp_path / "subs.zip", [
        (f"class/alice/{A}/{NB}", NOTEBOOK),
        (f"class/bob/{A}/{NB}", NOTEBOOK),
        (f"class/bob/{A}/notes.txt", "x"),
        (f"class/carol/99_unknown/{NB}", NOTEBOOK),
        ("class/stray.txt", "stray"),
        (f"class/bad id!/{A}/{NB}", NOTEBOOK),
        ("__MACOSX/class/alice/._first_kernel.ipynb", "x"),
    ])
    res = _collect(root, z, archive_dates=True)
    assert sorted(res["copied"]) == [f"alice/{A}/{NB}", f"bob/{A}/{NB}"]
    assert dict(res["skipped"]) == {
        "stray.txt": "not laid out <student>/<assignment>/<notebook>",
        f"bob/{A}/notes.txt": "not a notebook (.ipynb)",
        f"carol/99_unknown/{NB}": "unknown assignment '99_unknown'",
        f"bad id!/{A}/{NB}": "student id 'bad id!' has unsupported characters",
        "__MACOSX/class/alice/._first_kernel.ipynb": "hidden or system file",
    }
    assert nbformat.reads((root / "submitted" / "alice" / A / NB).read_text(), 4).cells == []
    assert _stamp(root, "alice").startswith(datetime(*WHEN).strftime("%Y-%m-%d %H:%M:%S"))
    with pytest.raises(FileNotFoundError):
        _collect(root, tmp_path / "nope.zip")


def test_collection_time_not_archive_dates_by_default(root, tmp_path):
    before = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    _collect(root, _zip(tmp_path / "subs.zip", [(f"alice/{A}/{NB}", NOTEBOOK)]))
    stamp = datetime.strptime(_stamp(root, "alice")[:19], "%Y-%m-%d %H:%M:%S")
    assert stamp >= before


def test_folder_links_and_devices_are_refused(root, tmp_path):
    subs = tmp_path / "subs"
    secret = tmp_path / "solution.ipynb"
    secret.write_text(NOTEBOOK.replace("{", "{ ", 1))
    for student in ("alice", "mallory", "eve", "trent", "oscar"):
        (subs / student / A).mkdir(parents=True)
    (subs / "alice" / A / NB).write_text(NOTEBOOK)
    os.symlink(secret, subs / "mallory" / A / NB)  # the instructor's solution
    os.symlink("/dev/zero", subs / "eve" / A / NB)  # endless bytes
    os.symlink(subs / "nowhere", subs / "trent" / A / NB)  # dangling
    os.mkfifo(subs / "oscar" / A / NB)  # would block a reader
    (subs / "linked").symlink_to(subs / "alice", target_is_directory=True)
    res = _collect(root, subs)
    skipped = dict(res["skipped"])
    assert res["copied"] == [f"alice/{A}/{NB}"]
    for student in ("mallory", "eve", "trent"):
        assert skipped[f"{student}/{A}/{NB}"] == "a symbolic link"
    assert skipped[f"oscar/{A}/{NB}"] == "not a regular file"
    assert skipped["linked"] == "a symbolic link"
    assert sorted(p.name for p in (root / "submitted").iterdir()) == ["alice"]


def test_zip_links_bombs_and_bad_entries_are_skipped_and_the_rest_collected(root, tmp_path):
    z = _zip(tmp_path / "subs.zip", [
        (f"alice/{A}/{NB}", NOTEBOOK),
        (f"mallory/{A}/{NB}", "/etc/passwd", stat.S_IFLNK | 0o777),
        (f"bomb/{A}/{NB}", b"\0" * (64 << 20)),
        (f"crc/{A}/{NB}", NOTEBOOK),
        ("alice\n/" + A + "/" + NB, NOTEBOOK),
        (f"zed/{A}/{NB}", NOTEBOOK),
    ])
    # corrupt crc/'s bytes in place: a bad CRC, found only when the entry is read
    raw = bytearray(z.read_bytes())
    with zipfile.ZipFile(z) as zf:
        info = zf.getinfo(f"crc/{A}/{NB}")
    at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 5
    raw[at] ^= 0xFF
    z.write_bytes(bytes(raw))
    res = _collect(root, z)
    skipped = dict(res["skipped"])
    assert sorted(res["copied"]) == [f"alice/{A}/{NB}", f"zed/{A}/{NB}"]
    assert skipped[f"mallory/{A}/{NB}"] == "a symbolic link"
    assert "compressed more than" in skipped[f"bomb/{A}/{NB}"]
    assert "unreadable in the archive" in skipped[f"crc/{A}/{NB}"]
    assert "unsupported characters" in skipped[f"alice\n/{A}/{NB}"]


def test_oversized_notebook_is_skipped(root, tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "MAX_NOTEBOOK_BYTES", 1000)
    subs = tmp_path / "subs"
    (subs / "big" / A).mkdir(parents=True)
    (subs / "big" / A / NB).write_bytes(os.urandom(2000))
    assert dict(_collect(root, subs)["skipped"]) == {f"big/{A}/{NB}": "larger than 1,000 bytes"}


def test_a_replaced_submission_is_reported(root, tmp_path):
    first = _zip(tmp_path / "first.zip", [(f"alice/{A}/{NB}", NOTEBOOK)])
    assert _collect(root, first)["replaced"] == []
    second = _zip(tmp_path / "second.zip", [(f"alice/{A}/{NB}", NOTEBOOK)])
    assert _collect(root, second)["replaced"] == [
        (f"alice/{A}/{NB}", "replaces the submission collected earlier")]
