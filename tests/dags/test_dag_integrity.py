"""Every DAG file imports cleanly, quickly, and without I/O at the top level (no file reads beyond code,
no sockets, no subprocesses): the scheduler parses these files all day."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = sorted((Path(__file__).resolve().parents[2] / "dags").glob("*.py"))

PROBE = r"""
import json, runpy, sys
# Import what DAG files legitimately import first, so their own one-time reads are not blamed on the DAG.
import airflow.sdk, kvfleet.airflow.params  # noqa
events = []
CODE = (".py", ".pyc", ".so", ".pth", ".typed", ".json", "__pycache__")
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and not args[0].endswith(CODE) and "site-packages" not in args[0]:
        events.append(("open", args[0]))
    elif event == "subprocess.Popen" and list(args[1])[:2] == ["file", "-b"]:
        pass  # platform.architecture() probing the interpreter, inside Airflow's lazy imports
    elif event in ("socket.connect", "subprocess.Popen", "os.system"):
        events.append((event, str(args[:2])))
sys.addaudithook(hook)
runpy.run_path(sys.argv[1])
print("EVENTS=" + json.dumps(events))
"""


@pytest.mark.parametrize("path", DAGS, ids=[p.stem for p in DAGS])
def test_dag_file_imports_without_top_level_io(path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("EVENTS=")][-1]
    events = [e for e in json.loads(line[len("EVENTS="):]) if not e[1].startswith(("/dev/", "/proc/"))]
    assert events == [], f"{path.name} does I/O at import time: {events}"


def test_every_dag_file_is_in_the_dagbag(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert {p.stem for p in DAGS} <= set(dagbag.dag_ids)
    for dag_id in dagbag.dag_ids:
        assert dagbag.get_dag(dag_id).tags == ["kvfleet"] or "kvfleet" in dagbag.get_dag(dag_id).tags
