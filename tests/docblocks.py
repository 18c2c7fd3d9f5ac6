"""The code blocks of README.md and docs/, as the doc tests read and run them.

A *command block* is a fenced block (```` ``` ````, ```` ```text ````, ```` ```console ````,
```` ```bash ````, ```` ```sh ````) that shows commands:

* a **session**: ``$ command`` lines, each followed by the output it prints (up to the next
  ``$`` line); a command continues on the next line while its quotes are open or it ends in ``\\``;
* **bare commands**: no ``$`` line, and lines that start with ``omni `` (or ``pip``, ``pytest``,
  ``python``): every non-blank line is a command, whose output the doc does not show.

HTML comments on the lines just above a block (blank lines between are allowed) say how to run it:

* ``<!-- not run: REASON -->``: the block is not run; REASON must start with one of
  :data:`NOT_RUN_REASONS`. Its ``omni`` commands are still checked against ``--help``.
* ``<!-- setup: CMD -->``: shell commands run before the block (they must succeed; their output
  is not compared). ``omni models make-tiny FAMILY /tmp/X`` is made once per session and copied.
* ``<!-- run with: NAME ... -->``: fixture plugins (``tests/fixtures/plugins/NAME``) pip-installed
  into a private site directory that the block's commands see (``PYTHONPATH``).
* ``<!-- with server: ARGS -->``: a real ``omni serve ARGS`` (:func:`serving.start_server`) runs
  while the block runs: started on a free loopback port once the setup is done, waited for until
  its ready line, stopped with SIGTERM after the block. It sees what the block's commands see
  (environment, cache, fixture plugins; ``/tmp/`` in ARGS is the block's directory) and the
  embedded defaults are already made unless ARGS has ``--model`` or the block shows
  ``making the embedded default``. Pages write the server's address as ``localhost:8000`` (or
  ``127.0.0.1:8000``): in the block's commands and in the page's files it becomes the real port;
  a ``--port`` in ARGS is dropped for the real one. ``2> /tmp/FILE`` in ARGS makes the server's
  stderr (its request log) readable as ``/tmp/FILE``. A ``$ omni serve ARGS`` line in the block
  (the same ARGS) is not run again: it stands for that server, and its shown output is compared
  with everything the server printed on stdout until it stopped, its exit code with the shown
  success or failure as for any command.

A fenced ```` ```python title="/tmp/PATH" ```` block is a file: it is written to ``/tmp/PATH``
for every block of the same page.

Every block runs in its own private directory that stands for ``/tmp``: ``/tmp/`` in commands
means it, and it is written back as ``/tmp`` in the output before comparing. The cwd is that
directory, where ``recipes/`` is the repository's (as in a checkout); ``OMNI_CONFIG_DIR`` is
``/tmp/omnidemo/config`` and ``OMNI_CACHE_DIR`` is
``/tmp/omni-doc-cache``, fresh for each block, except that the embedded defaults are already made
there unless the block shows ``making the embedded default``.

Matching rule (:func:`compare`), shown lines against printed lines (stdout and stderr together):

1. each line is normalised: the last ``\\r`` frame of a progress bar is kept; the block's private
   directory becomes ``/tmp``; 64-digit hex hashes, then every number (``12``, ``0.66``,
   ``2.13.0``) become ``#``; runs of spaces collapse to one; a table rule (dashes and spaces only)
   becomes ``--``;
2. ``...`` inside a shown line matches any text; a shown line that is only ``...`` matches any
   number of printed lines (none included);
3. otherwise the shown lines must equal the printed ones, in order, with nothing left over;
4. progress-bar lines (``NN%|``) that the doc does not show are ignored (libraries print their own);
   a bar printed as several lines (no terminal) counts as its last line;
5. the exit code must be 0, unless the shown output has an ``error:``, ``problem N:`` or
   ``=> nothing selected`` line or a Python exception line, and then it must not be 0; an
   ``omni`` command that prints a traceback fails.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serving import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[1]
#: the server address pages show; a ``with server`` block's commands get the real one
SHOWN_ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):8000\b")
BIN = Path(sys.executable).parent
FIXTURE_PLUGINS = Path(__file__).parent / "fixtures" / "plugins"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

#: why a command block may stay unrun; a marker's reason starts with one of these
NOT_RUN_REASONS = {
    "needs a real checkpoint": "a released checkpoint under ~/models or /models: gigabytes, not here",
    "needs the package index": "pip installs from PyPI: the tests run offline",
    "needs vendor hardware": "a GPU or NPU this machine does not have",
    "installs into the environment": (
        "pip install -e into the running venv; tests/test_plugin_template.py does it in a throw-away one"
    ),
    "synopsis": "usage lines, not a command: their options are checked against --help",
    "run by tests/test_docs_authoring.py": "it needs the package the page builds; that test assembles and installs it",
    "run by omni_plugins/vllm/tests/test_docs_vllm.py": (
        "it needs vLLM, which only .venv-vllm has; that test runs these blocks there"
    ),
}

_FENCE = re.compile(r"^```(\w*)(.*)$")
_COMMENT = re.compile(r"^<!--\s*([\w ]+?)\s*:\s*(.*?)\s*-->$", re.S)
_SHELL_LANGS = {"", "text", "console", "bash", "sh", "shell"}
_BARE = re.compile(r"^(omni|pip|pytest|python)\s")
_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_HASH = re.compile(r"\b[0-9a-f]{64}\b")
_PROGRESS = re.compile(r"(\d+|#)%\|")
_EXCEPTION = re.compile(r"^[\w.]+(Error|Exception): ")


@dataclass
class Step:
    command: str
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: list[str]
    markers: dict[str, str]
    steps: list[Step]
    bare: bool

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO).as_posix()}:{self.line}"

    @property
    def not_run(self) -> str | None:
        return self.markers.get("not run")

    def omni_commands(self) -> list[str]:
        """The ``omni ...`` commands of the block (environment assignments dropped)."""
        found = []
        for step in self.steps:
            words = step.command
            words = re.sub(r"^(\w+=\S*\s+)+", "", words)
            if words.startswith("omni "):
                found.append(words)
        return found


@dataclass
class FileBlock:
    page: Path
    path: str
    text: str


def _markers(lines: list[str], index: int) -> dict[str, str]:
    """The HTML comments just above line ``index`` (blank lines and other comments between)."""
    found: dict[str, str] = {}
    i = index - 1
    while i >= 0:
        text = lines[i].strip()
        if not text:
            i -= 1
            continue
        if text.endswith("-->"):
            start = i
            while not lines[start].lstrip().startswith("<!--"):
                start -= 1
            match = _COMMENT.match(" ".join(x.strip() for x in lines[start : i + 1]))
            if match:
                found.setdefault(match.group(1).strip(), match.group(2).strip())
            i = start - 1
            continue
        break
    return found


def _complete(command: str) -> bool:
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def _steps(body: list[str]) -> tuple[list[Step], bool]:
    if any(line.startswith("$ ") for line in body):
        steps: list[Step] = []
        i = 0
        while i < len(body):
            line = body[i]
            if line.startswith("$ "):
                command = line[2:]
                while not _complete(command) and i + 1 < len(body):
                    i += 1
                    command += "\n" + body[i]
                steps.append(Step(command))
            elif steps:
                steps[-1].shown.append(line)
            i += 1
        for step in steps:
            while step.shown and not step.shown[-1].strip():
                step.shown.pop()
        return steps, False
    commands: list[Step] = []
    pending = ""
    for line in body:
        if not line.strip() and not pending:
            continue
        if line[:1].isspace() and not pending and commands:
            commands[-1].command += "\n" + line  # a synopsis continues on indented lines
            continue
        pending = f"{pending}\n{line}" if pending else line
        if _complete(pending):
            commands.append(Step(pending))
            pending = ""
    return commands, True


def page_blocks(page: Path) -> tuple[list[Block], list[FileBlock]]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    files: list[FileBlock] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        lang, info, body = fence.group(1), fence.group(2), lines[i + 1 : end]
        title = re.search(r'title="([^"]+)"', info)
        if lang == "python" and title and title.group(1).startswith("/tmp/"):
            files.append(FileBlock(page, title.group(1), "\n".join(body) + "\n"))
        elif lang in _SHELL_LANGS and (
            any(line.startswith("$ ") for line in body) or any(_BARE.match(line) for line in body)
        ):
            steps, bare = _steps(body)
            blocks.append(Block(page, i + 1, lang, body, _markers(lines, i), steps, bare))
        i = end + 1
    return blocks, files


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)[0]]


# -- matching ---------------------------------------------------------------------------------


def normalise(line: str) -> str:
    line = line.rsplit("\r", 1)[-1].rstrip()
    line = _HASH.sub("#", line)
    line = _NUMBER.sub("#", line)
    line = re.sub(r"\s+", " ", line).strip()
    if line and set(line) <= {"-", " "} and "--" in line:
        return "--"
    return line


def _is_progress(line: str) -> bool:
    return bool(_PROGRESS.search(line))


def _pattern(shown: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in shown.split("...")))


def compare(shown: list[str], printed: list[str]) -> str | None:
    """None when ``printed`` matches ``shown`` under the rule above, else what differs."""
    want = [normalise(s) for s in shown]
    want = [w for w in want if w]
    labels = {w.split(":")[0] for w in want if _is_progress(w)}
    got = [normalise(p) for p in printed]
    got = [g for g in got if g and (not _is_progress(g) or g.split(":")[0] in labels)]
    # a bar redrawn on new lines (no terminal) counts once, as its last frame
    got = [
        g
        for k, g in enumerate(got)
        if not (
            _is_progress(g)
            and k + 1 < len(got)
            and _is_progress(got[k + 1])
            and got[k + 1].split(":")[0] == g.split(":")[0]
        )
    ]

    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            if i == len(want):
                ok = j == len(got)
            elif want[i] == "...":
                ok = any(match(i + 1, k) for k in range(j, len(got) + 1))
            else:
                ok = j < len(got) and bool(_pattern(want[i]).fullmatch(got[j])) and match(i + 1, j + 1)
            memo[key] = ok
        return memo[key]

    if match(0, 0):
        return None
    # the first shown line that cannot be placed, for the message
    j = 0
    for i, w in enumerate(want):
        if w == "...":
            continue
        found = next((k for k in range(j, len(got)) if _pattern(w).fullmatch(got[k])), None)
        if found is None:
            return f"shown line {i + 1} not printed (after printed line {j}): {w!r}"
        j = found + 1
    return "the shown lines are all printed, but printed lines are missing from the doc (add them, or '...')"


def expects_failure(shown: list[str]) -> bool:
    return any(
        s.startswith(("error:", "=> nothing selected", "  => nothing selected"))
        or re.match(r"problem \d+:", s)
        or _EXCEPTION.match(s)
        for s in shown
    )


# -- running ----------------------------------------------------------------------------------


def env_for(tmp: Path, site: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(BIN.parent),
        OMNI_CONFIG_DIR=str(tmp / "omnidemo" / "config"),
        OMNI_CACHE_DIR=str(tmp / "omni-doc-cache"),
        PYTHONUNBUFFERED="1",
        PIP_NO_INDEX="1",  # offline: nothing from a package index
        HOME=str(tmp / "home"),
        # the shown outputs come from a 2-core machine; thread counts only change the timing
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
    )
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


def localise(command: str, tmp: Path) -> str:
    """``/tmp/...`` in a doc command is the block's private directory."""
    return re.sub(r"(?<![\w/])/tmp(?=/|\b)", str(tmp), command)


MAKE_TINY = re.compile(r"^omni models make-tiny (\S+) (/tmp/\S+)((?: --\S+(?: \S+)?)*)$")


def run_shell(command: str, tmp: Path, env: dict[str, str], timeout: float = 600) -> tuple[int, list[str]]:
    proc = subprocess.run(
        ["bash", "-c", localise(command, tmp)],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    text = proc.stdout.replace(str(tmp), "/tmp")
    # a progress bar redraws its line with \r: keep the last frame of each line
    return proc.returncode, [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def copy_tree(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest, symlinks=True)


# -- running blocks, with state shared by the blocks of a session -----------------------------


class Session:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tiny: dict[str, Path] = {}
        self.sites: dict[tuple[str, ...], Path] = {}
        self.defaults: dict[str, Path] = {}

    def made_tiny(self, family: str, options: str) -> Path:
        """``omni models make-tiny FAMILY DIR OPTIONS``, once per session."""
        key = f"{family}{options}"
        if key not in self.tiny:
            home = self.root / f"tiny-{len(self.tiny)}"
            home.mkdir()
            code, out = run_shell(f"omni models make-tiny {family} ckpt{options}", home, env_for(home))
            assert code == 0, "\n".join(out)
            self.tiny[key] = home / "ckpt"
        return self.tiny[key]

    def site(self, names: tuple[str, ...]) -> Path:
        """Fixture plugins pip-installed for real into a directory only these blocks see."""
        if names not in self.sites:
            base = self.root / f"site-{len(self.sites)}"
            src, site = base / "src", base / "site"
            paths = []
            for name in names:
                assert (FIXTURE_PLUGINS / name / "pyproject.toml").is_file(), f"no fixture plugin {name!r}"
                shutil.copytree(
                    FIXTURE_PLUGINS / name,
                    src / name,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
                )
                paths.append(str(src / name))
            subprocess.run(
                [
                    str(BIN / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--no-build-isolation",
                    "--target",
                    str(site),
                    *paths,
                ],
                check=True,
                capture_output=True,
            )
            self.sites[names] = site
        return self.sites[names]

    def embedded_default(self, kind: str) -> Path:
        """The cache of a process that has made the embedded default for ``speak`` or ``generate``
        (for ``speak``, only the fallback voice is made: an installed real voice is not)."""
        if kind not in self.defaults:
            home = self.root / f"default-{kind}"
            (home / "home").mkdir(parents=True)
            command = "omni speak hello -o x.wav" if kind == "speak" else "omni generate x -o x.png"
            code, out = run_shell(command, home, env_for(home))
            assert code == 0, "\n".join(out)
            self.defaults[kind] = home / "omni-doc-cache" / "tiny"
        return self.defaults[kind]


def at_port(text: str, port: int | None) -> str:
    """The server address a page shows (``localhost:8000``) as the real server's."""
    return text if port is None else SHOWN_ADDRESS.sub(lambda m: f"{m.group(1)}:{port}", text)


def server_args(value: str) -> tuple[list[str], str | None]:
    """A ``with server`` marker's ARGS: (the arguments for ``omni serve``, where its stderr goes).
    A ``--port`` is dropped: the test picks a free port."""
    words = shlex.split(value)
    args: list[str] = []
    log = None
    i = 0
    while i < len(words):
        word = words[i]
        if word == "2>" and i + 1 < len(words):
            log, i = words[i + 1], i + 2
        elif word.startswith("2>") and len(word) > 2:
            log, i = word[2:], i + 1
        elif word in ("--port", "-p"):
            i += 2
        elif word.startswith("--port="):
            i += 1
        else:
            args.append(word)
            i += 1
    return args, log


def _write_files(block: Block, tmp: Path, port: int | None = None) -> None:
    for page_file in page_blocks(block.page)[1]:
        target = Path(localise(page_file.path, tmp))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(at_port(localise(page_file.text, tmp), port), encoding="utf-8")


def _setup(block: Block, tmp: Path, session: Session, env: dict[str, str]) -> None:
    _write_files(block, tmp)
    shows_making = any("making the embedded default" in line for step in block.steps for line in step.shown)
    if not shows_making:
        kinds = set()
        for step in block.omni_commands():
            for kind in ("speak", "generate"):
                if step.startswith(f"omni {kind} ") and "--model" not in step:
                    kinds.add(kind)
        if "with server" in block.markers:
            args, _ = server_args(block.markers["with server"])
            if "--model" not in args and "-m" not in args:
                kinds |= {"speak", "generate"}
        for kind in sorted(kinds):
            made_by = session.embedded_default(kind)  # none when a real default voice needed nothing made
            for made in made_by.iterdir() if made_by.is_dir() else ():
                if made.is_dir() and not (tmp / "omni-doc-cache" / "tiny" / made.name).exists():
                    copy_tree(made, tmp / "omni-doc-cache" / "tiny" / made.name)
    for command in filter(None, (c.strip() for c in block.markers.get("setup", "").split(";"))):
        tiny = MAKE_TINY.match(command)
        if tiny and "run with" not in block.markers:  # a fixture plugin's family is made in the block's own site
            copy_tree(session.made_tiny(tiny.group(1), tiny.group(3)), Path(localise(tiny.group(2), tmp)))
            continue
        code, out = run_shell(command, tmp, env)
        assert code == 0, f"{block.id}: setup `{command}` failed:\n" + "\n".join(out)


def run_block(
    block: Block,
    tmp: Path,
    session: Session,
    site: Path | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> list[str]:
    """Run one block; the list of what differs from the doc (empty when it matches)."""
    (tmp / "home").mkdir(parents=True, exist_ok=True)
    (tmp / "omnidemo" / "config").mkdir(parents=True, exist_ok=True)
    (tmp / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    if prepare is not None:
        prepare(tmp)
    names = tuple(block.markers.get("run with", "").split())
    env = env_for(tmp, site or (session.site(names) if names else None))
    _setup(block, tmp, session, env)
    # never into the venv that runs the tests (a doc's `pip install -e` would stay installed)
    installs = [
        s.command for s in block.steps if re.search(r"\bpip install\b", s.command) and "--target" not in s.command
    ]
    assert not installs, f"{block.id} installs into the environment: mark it `<!-- not run: installs into ... -->`"
    server = _start_server(block, tmp, env)
    port = server.port if server is not None else None
    if server is not None:
        _write_files(block, tmp, port)
    problems: list[str] = []
    served: list[Step] = []
    try:
        for step in block.steps:
            if server is not None and _is_serve(step.command):
                served.append(step)  # stands for the marker's server: compared once it stopped
                continue
            problems += _run_step(block, step, tmp, env, port)
    finally:
        if server is not None:
            code = _stop(server)
    if server is not None:
        wanted = ["omni", "serve", *shlex.split(block.markers["with server"])]
        for step in served:
            where = f"$ {step.command}"
            if shlex.split(step.command) != wanted:
                problems.append(f"{where}\n  is not the marker's server: `{' '.join(wanted)}`")
                continue
            problems += _compare(block, step, where, code, server.lines)
    return problems


def _is_serve(command: str) -> bool:
    return re.sub(r"^(\w+=\S*\s+)+", "", command).startswith("omni serve")


def _start_server(block: Block, tmp: Path, env: dict[str, str]) -> ServerProcess | None:
    """The ``with server`` marker's ``omni serve``, ready, or None without the marker."""
    if "with server" not in block.markers:
        return None
    args, log = server_args(block.markers["with server"])
    server = start_server([localise(a, tmp) for a in args], home=tmp, env=env)
    if log is not None:
        Path(localise(log, tmp)).symlink_to(server.stderr_path)
    return server


def _stop(server: ServerProcess) -> int:
    """SIGTERM, as an operator stops it; its exit status once its last line was read."""
    code = server.stop()
    seen, quiet_since = len(server.lines), time.monotonic()
    deadline = quiet_since + 5
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 0.3:
        time.sleep(0.05)
        if len(server.lines) != seen:
            seen, quiet_since = len(server.lines), time.monotonic()
    return code


def _run_step(block: Block, step: Step, tmp: Path, env: dict[str, str], port: int | None) -> list[str]:
    code, printed = run_shell(at_port(step.command, port), tmp, env)
    where = f"$ {step.command}"
    if block.bare:
        return [f"{where}\n  exited {code}:\n" + "\n".join(printed[-20:])] if code != 0 else []
    return _compare(block, step, where, code, printed)


def _compare(block: Block, step: Step, where: str, code: int, printed: list[str]) -> list[str]:
    """What differs between a step's shown output and exit, and what it printed and returned."""
    text = "\n".join(printed)
    # omni never shows the user a traceback; the user's own Python code may
    is_omni = re.sub(r"^(\w+=\S*\s+)+", "", step.command).startswith("omni ")
    if "Traceback (most recent call last)" in text and is_omni:
        return [f"{where}\n  printed a traceback:\n{text}"]
    failing = expects_failure(step.shown)
    if failing != (code != 0):
        return [f"{where}\n  exited {code}, the doc shows {'a failure' if failing else 'success'}:\n{text}"]
    diff = compare(step.shown, printed)
    return [f"{where}\n  {diff}\n  --- printed:\n{text}"] if diff else []
