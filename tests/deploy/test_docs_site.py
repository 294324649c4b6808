"""The docs site, built as `make docs` builds it: every alert's runbook URL names a page and an anchor
the site has (mkdocs checks links between its pages, never absolute URLs), and the README's links
into the docs land."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.deploy import DEPLOY, ROOT, rules

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built as `make docs` builds it (strict: a broken link or anchor fails)."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                             "-d", str(out)], capture_output=True, text=True, check=False,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    return out


class _Ids(HTMLParser):
    """Every id attribute of an HTML page: the anchors a link can name."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def anchors_of(page: Path) -> set[str]:
    parser = _Ids()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.ids


def test_every_alert_has_annotations_and_a_runbook_page_with_its_anchor_on_the_site(site: Path) -> None:
    base = yaml.safe_load((DEPLOY / "helm" / "stream-ndcg" / "values.yaml").read_text())["alerts"]["runbookBaseUrl"]
    # mkdocs checks links between pages, not absolute URLs: the default base must be the site's own address.
    assert base.rstrip("/") == yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"].rstrip("/")
    alerts = [r for r in rules() if "alert" in r]
    assert alerts
    for rule in alerts:
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        url = urlsplit(annotations["runbook_url"])
        assert f"{url.scheme}://{url.netloc}{url.path}".startswith(base.rstrip("/") + "/runbooks/"), url
        assert url.fragment == rule["alert"].lower(), url
        page = site / url.path.removeprefix(urlsplit(base).path.rstrip("/")).strip("/") / "index.html"
        assert page.is_file(), f"the site has no runbook page for {rule['alert']}: {url.geturl()}"
        assert url.fragment in anchors_of(page), f"{page.relative_to(site)} has no anchor #{url.fragment}"


def test_the_readme_links_into_the_docs_name_pages_and_anchors_that_exist(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs|bench)/[^)#]+)(?:#([^)]*))?\)", readme)
    assert links
    for target, fragment in links:
        assert (ROOT / target).is_file(), target
        if fragment:
            page = Path(target).relative_to("docs").with_suffix("")
            html = site / (page.parent if page.name == "index" else page) / "index.html"
            assert fragment in anchors_of(html), f"{target} has no anchor #{fragment}"
