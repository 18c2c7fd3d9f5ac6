"""``omni doctor`` says whether ``omni serve`` can run: the serving packages installed, or which
are missing and the command that installs them. Serving is optional, so a missing package is
reported, never counted as a problem.

Absence is real to the process: a ``sitecustomize`` on its ``PYTHONPATH`` marks the packages
as not importable (``sys.modules[name] = None``), which is what ``importlib.util.find_spec``
and ``import`` both honour, so ``omni doctor`` and ``omni serve`` see the same environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_core.server.runner import missing_packages

OMNI = Path(sys.executable).parent / "omni"
FIX = "pip install 'omni-core[serve]'"
HIDDEN = ("fastapi", "uvicorn")


def _omni(tmp_path: Path, *args: str, hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    if hide:
        site = tmp_path / "hide"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            f"import sys\nfor name in {hide!r}:\n    sys.modules[name] = None  # not importable, not findable\n",
            encoding="utf-8",
        )
        env["PYTHONPATH"] = str(site)
    return subprocess.run([str(OMNI), *args], capture_output=True, text=True, env=env, timeout=300, check=False)


def _serve_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("serve ")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_doctor_reports_the_serving_packages_installed(tmp_path: Path):
    if missing_packages():
        pytest.skip(f"the serve extra is not installed here ({', '.join(missing_packages())} missing)")
    text = _omni(tmp_path, "doctor")
    assert _serve_line(text.stdout) == "serve       installed (omni serve can run)"
    report = json.loads(_omni(tmp_path, "doctor", "--json").stdout)
    assert report["serve"] == {"missing": [], "fix": None}


def test_doctor_names_the_missing_serving_packages_and_the_fix_without_counting_a_problem(tmp_path: Path):
    expected = [dist for dist in ("fastapi", "uvicorn", "prometheus-client", "python-multipart")
                if dist in HIDDEN or dist in missing_packages()]  # fmt: skip
    text = _omni(tmp_path, "doctor", hide=HIDDEN)
    assert _serve_line(text.stdout) == f"serve       missing {', '.join(expected)}; for omni serve: {FIX}"
    assert "Traceback" not in text.stdout + text.stderr
    report = json.loads(_omni(tmp_path, "doctor", "--json", hide=HIDDEN).stdout)
    assert report["serve"] == {"missing": expected, "fix": FIX}
    assert not [p for p in report["problems"] if "serve" in p["problem"] or p["fix"] == FIX]
    # and omni serve itself, in the same environment, stops with the same fix
    served = _omni(tmp_path, "serve", "--port", "0", hide=HIDDEN)
    assert served.returncode == 1, served.stdout + served.stderr
    assert f"omni serve needs {', '.join(expected)}, which this environment lacks: {FIX}" in served.stderr
