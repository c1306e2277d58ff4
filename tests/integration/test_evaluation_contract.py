"""What the evaluation assumes of libreyolo's validator, checked against libreyolo itself: a prediction's
``image_id`` is the image's index in the split as libreyolo lists it."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from entrypoint.evaluation import split


@pytest.mark.contract
def test_the_split_lists_its_images_in_libreyolos_order(tmp_path: Path) -> None:
    from libreyolo.data.utils import get_img_files

    folder = tmp_path / "images" / "test"
    for name in ("b.png", "a.JPG", "sub/c.jpg", "z.webp", "notes.txt", "sub/deeper/0.png"):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".txt"):
            path.write_text("not an image\n")
        else:
            Image.new("RGB", (8, 8)).save(path, format="PNG")
    listing = tmp_path / "test.txt"
    listing.write_text("images/test/z.webp\n# a comment\nimages/test/b.png\n")
    for entry in (folder, listing, [str(folder), str(listing)]):
        wanted = get_img_files(entry if isinstance(entry, list) else str(entry))
        assert split.listed(entry, tmp_path) == [Path(p) for p in wanted], entry
