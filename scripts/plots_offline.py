"""Write the page template `dvc plots show` uses, with Vega, Vega-Lite and Vega-Embed inlined (issue 22).

DVC's own page loads the three bundles from cdn.jsdelivr.net, so without internet every plot stays blank.
This script takes them from the npm registry once, at install time: exact versions, each tarball checked
against the sha512 integrity npm published for it, and writes the git-ignored `.dvc/plots/offline.html`,
which `plots.html_template` in the committed `.dvc/config` names. Idempotent: when the page is already
there for these pins it returns at once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / ".dvc" / "plots" / "offline.html"
REGISTRY = "https://registry.npmjs.org"
DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class Bundle:
    """One npm package whose browser build the page inlines, pinned so every install inlines the same bytes."""

    package: str
    version: str
    integrity: str  # npm's dist.integrity for the tarball: "sha512-" + base64 digest
    path: str  # the browser build inside the tarball (the package.json "jsdelivr" file DVC's CDN URL serves)

    @property
    def tarball_url(self) -> str:
        return f"{REGISTRY}/{self.package}/-/{self.package}-{self.version}.tgz"


# The majors and minors dvc-render 1.0.2 loads from the CDN (vega@5.20.2, vega-lite@5.2.0, vega-embed@6.18.2);
# vega is 5.21.0 because vega-lite 5.2.0 declares the peer dependency vega ^5.21.0.
BUNDLES = (
    Bundle(
        "vega",
        "5.21.0",
        "sha512-yqqRa9nAqYoAxe7sVhRpsh0b001fly7Yx05klPkXmrvzjxXd07gClW1mOuGgSnVQqo7jTp/LYgbO1bD37FbEig==",
        "package/build/vega.min.js",
    ),
    Bundle(
        "vega-lite",
        "5.2.0",
        "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
        "package/build/vega-lite.min.js",
    ),
    Bundle(
        "vega-embed",
        "6.18.2",
        "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
        "package/build/vega-embed.min.js",
    ),
)

# How the page starts: a page written for other pins is rewritten.
PAGE_HEAD = (
    "<!DOCTYPE html>\n<!-- fedrepro offline plots: "
    + " ".join(f"{b.package}@{b.version} {b.integrity}" for b in BUNDLES)
    + " -->\n"
)

# DVC fills {plot_divs} with one <div> per plot, each calling vegaEmbed. The page leaves out DVC's {scripts}
# placeholder on purpose: that is where DVC would put its CDN <script> tags.
PAGE_HTML = """{head}<html>
<head>
    <title>DVC Plot</title>
{scripts}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""

# Text in a bundle that would break the page: DVC replaces its placeholders anywhere in the template, and a
# closing script tag would end the inline script early.
UNSAFE_IN_BUNDLE = ("{plot_divs}", "{scripts}", "{refresh_tag}", "</script", "<!--")


def download(bundle: Bundle) -> bytes:
    """The tarball, checked against its pinned integrity; any failure stops the install with one line."""
    try:
        with urllib.request.urlopen(bundle.tarball_url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            tarball = response.read()
    except (urllib.error.URLError, OSError) as error:
        sys.exit(
            f"plots_offline.py: cannot download {bundle.package}@{bundle.version} from {bundle.tarball_url} "
            f"({error}); the offline plot page needs the npm registry once, at install time"
        )
    algorithm, expected = bundle.integrity.split("-", 1)
    actual = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if actual != expected:
        sys.exit(
            f"plots_offline.py: {bundle.tarball_url} does not match its pinned integrity "
            f"(expected {algorithm}-{expected}, got {algorithm}-{actual}); refusing to use it"
        )
    return tarball


def browser_build(bundle: Bundle, tarball: bytes) -> str:
    """The minified browser build from the tarball, checked to be safe to inline in the page."""
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        try:
            member = archive.extractfile(bundle.path)
        except KeyError:
            member = None
        if member is None:
            sys.exit(f"plots_offline.py: {bundle.tarball_url} has no {bundle.path}")
        script = member.read().decode("utf-8")
    for unsafe in UNSAFE_IN_BUNDLE:
        if unsafe in script:
            sys.exit(
                f"plots_offline.py: {bundle.package}@{bundle.version} {bundle.path} contains {unsafe!r}, "
                f"which would break the inlined page"
            )
    return script


def page_html() -> str:
    scripts = "\n".join(
        f"    <script>/* {b.package}@{b.version} from {b.tarball_url} */\n"
        f"{browser_build(b, download(b))}\n    </script>"
        for b in BUNDLES
    )
    return PAGE_HTML.format(head=PAGE_HEAD, scripts=scripts)


def main() -> None:
    if PAGE.is_file() and PAGE.read_text(encoding="utf-8").startswith(PAGE_HEAD):
        return
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    partial = PAGE.with_name(PAGE.name + ".partial")
    partial.write_text(page_html(), encoding="utf-8")
    os.replace(partial, PAGE)  # a run stopped half-way never leaves a page behind that looks done
    print(f"plots_offline.py: wrote {PAGE.relative_to(ROOT)} (vega, vega-lite, vega-embed inlined)")


if __name__ == "__main__":
    main()
