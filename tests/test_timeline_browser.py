"""The demo's timeline page opened in headless Chromium (Debian's ``chromium``, which
.ci/run installs): the DOM it builds holds a bar per node pool and per task, the
screenshot is not blank and shows the supply modes' colours, and the console stays
silent (no script error, nothing fetched). Chromium missing is a failure, not a skip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from falcon_es.projections.timeline_page import MODE_COLOURS, render
from tests.test_timeline import demo_db, demo_page, parsed  # noqa: F401 (the fixture)

INSTALL_HINT = ("headless Chromium is needed to test the timeline page: install Debian's "
                "package with `apt-get install -y chromium` (.ci/run does)")
BROWSER_SECONDS = 90
#: Chromium's log line for a console message (any level) with --enable-logging=stderr.
CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return found


def headless(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium on ``page`` with no network (every host unresolvable), logging to stderr."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr",
               "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_SECONDS,
                          check=False, stdin=subprocess.DEVNULL)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE.search(line)]


def test_chromium_draws_the_demo_timeline(demo_db: str, tmp_path: Path) -> None:  # noqa: F811
    page = demo_page(demo_db)
    html_file = tmp_path / "timeline.html"
    html_file.write_text(render(page), encoding="utf-8")
    dumped = headless(html_file, tmp_path / "profile-dom", "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = parsed(dumped.stdout)
    assert len(dom.with_class("pool")) == len(page.pools) == 10
    assert len(dom.with_class("task")) == len(page.tasks) == 11
    assert console_lines(dumped.stderr) == []
    shot = tmp_path / "timeline.png"
    taken = headless(html_file, tmp_path / "profile-shot", f"--screenshot={shot}",
                     "--window-size=1400,1000")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    assert console_lines(taken.stderr) == []
    image = Image.open(shot).convert("RGB")
    colours = {colour for _, colour in image.getcolors(maxcolors=1 << 20) or []}
    assert len(colours) > 50, "the screenshot is (nearly) blank"
    for mode in ("reservation", "flex-start"):
        wanted = tuple(int(MODE_COLOURS[mode][i:i + 2], 16) for i in (1, 3, 5))
        assert wanted in colours, f"no {mode} bar drawn"


def test_a_console_error_would_be_seen(tmp_path: Path) -> None:
    """The check above can fail: a page whose script throws is caught."""
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    result = headless(broken, tmp_path / "profile", "--dump-dom")
    assert any("undefinedFunction" in line for line in console_lines(result.stderr))
