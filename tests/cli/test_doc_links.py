"""Every relative link between the pages, and every anchor it names, resolves (standard library only: headings are
read as GitHub makes their ids)."""

import re
from pathlib import Path

from doc_pages import PAGES, REPO

ANCHOR_PUNCTUATION = re.compile(r"[^\w\- ]")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen, anchors = {}, set()
    text = FENCE_BLOCKS.sub("", page.read_text())
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = ANCHOR_PUNCTUATION.sub("", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


FENCE_BLOCKS = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_and_anchor_of_the_pages_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE_BLOCKS.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
                broken.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_anchors_are_the_ids_github_gives_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## The `model` section (rl runs)\n\n```bash\n# not a heading\n```\n\n## Title\n## Q: why?\n"
    )
    assert _anchors(page) == {"title", "the-model-section-rl-runs", "title-1", "q-why"}
