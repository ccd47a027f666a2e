"""`dvc plots show` draws every plot of dvc.yaml in a browser with no network (issue 22).

DVC's own page loads Vega from cdn.jsdelivr.net and stays blank offline; `.dvc/config` points
`plots.html_template` at the page scripts/plots_offline.py writes with the bundles inlined. Chromium opens the
page inside a network namespace with only loopback up (loopback.py), and a control run shows DVC's CDN page
drawing nothing there, so the plots that do draw cannot have come from the internet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from dvc_render.html import PAGE_HTML as DVC_CDN_PAGE

from loopback import run_on_loopback

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_PAGE = ROOT / ".dvc" / "plots" / "offline.html"
# DVC's plot <div>: <div id = "ID"><script> ... vegaEmbed('#ID', spec); </script></div>
EMBEDDED_PLOT_ID = re.compile(r"vegaEmbed\('#(.*?)', spec\)")


class DrawnPlots(HTMLParser):
    """Ids of the given plot <div>s that hold what Vega draws into: a <canvas> or <svg> of class "marks"."""

    def __init__(self, plot_ids: set[str]):
        super().__init__()
        self.plot_ids = plot_ids
        self.drawn: set[str] = set()
        self.open_plot: str | None = None
        self.div_depth = 0  # <div>s open inside self.open_plot

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if self.open_plot is None:
            if tag == "div" and attributes.get("id") in self.plot_ids:
                self.open_plot, self.div_depth = attributes["id"], 0
            return
        if tag == "div":
            self.div_depth += 1
        elif tag in ("canvas", "svg") and "marks" in (attributes.get("class") or "").split():
            self.drawn.add(self.open_plot)

    def handle_endtag(self, tag):
        if self.open_plot is None or tag != "div":
            return
        if self.div_depth == 0:
            self.open_plot = None
        else:
            self.div_depth -= 1


@pytest.fixture(scope="module")
def chromium() -> str:
    installed = subprocess.run(["bash", str(ROOT / "scripts" / "install_chromium.sh")], capture_output=True, text=True)
    if installed.returncode != 0:
        pytest.skip(f"no Chromium to open the plots page: {installed.stderr.strip()}")
    return "chromium"


def dvc_plots_show(out: Path, *options: str) -> subprocess.CompletedProcess:
    """`dvc plots show` on the committed plot files; writes nothing outside ``out``."""
    return subprocess.run(
        [sys.executable, "-m", "dvc", "plots", "show", "-o", str(out), *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )


def plot_page(out: Path, *options: str) -> Path:
    shown = dvc_plots_show(out, *options)
    assert shown.returncode == 0, f"dvc plots show failed:\n{shown.stderr}"
    return out / "index.html"


def drawn_in_offline_chromium(chromium: str, page: Path, profile: Path) -> tuple[set[str], set[str]]:
    """(the page's plot ids, those Chromium drew) with the page opened where nothing but loopback is reachable."""
    plot_ids = set(EMBEDDED_PLOT_ID.findall(page.read_text(encoding="utf-8")))
    dom = run_on_loopback(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        timeout=60,
    ).stdout
    parser = DrawnPlots(plot_ids)
    parser.feed(dom)
    return plot_ids, parser.drawn


def test_every_plot_draws_without_network(chromium, tmp_path):
    assert OFFLINE_PAGE.is_file(), f"{OFFLINE_PAGE} is missing: run `bash scripts/install.sh`"
    page = plot_page(tmp_path / "plots")
    assert "cdn.jsdelivr.net" not in page.read_text(encoding="utf-8"), "dvc plots show wrote DVC's CDN page"
    plot_ids, drawn = drawn_in_offline_chromium(chromium, page, tmp_path / "profile")
    plots_in_dvc_yaml = len(yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"])
    assert len(plot_ids) == plots_in_dvc_yaml, f"the page has {len(plot_ids)} plots, dvc.yaml {plots_in_dvc_yaml}"
    assert drawn == plot_ids, f"not drawn: {sorted(plot_ids - drawn)}"


def test_dvc_cdn_page_draws_nothing_in_the_same_browser(chromium, tmp_path):
    """The control: proves Chromium had no network, and that the offline page is what makes the plots draw."""
    cdn_template = tmp_path / "dvc_cdn_page.html"
    cdn_template.write_text(DVC_CDN_PAGE, encoding="utf-8")
    plot_ids, drawn = drawn_in_offline_chromium(
        chromium, plot_page(tmp_path / "plots", "--html-template", str(cdn_template)), tmp_path / "profile"
    )
    assert plot_ids and not drawn


def test_missing_template_stops_dvc_instead_of_writing_the_cdn_page(tmp_path):
    shown = dvc_plots_show(tmp_path / "plots", "--html-template", str(tmp_path / "never_written.html"))
    assert shown.returncode != 0 and "{plot_divs}" in shown.stderr
    assert not (tmp_path / "plots" / "index.html").exists()
