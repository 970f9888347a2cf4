"""The photo and the video `make run` sends are read by the attachments job as configured: the
fetcher refuses chatmem's own data folder, where the demo used to write the photo (it then
failed, silently)."""

import pytest

from chatmem.api.demo import BOARDING_PASS, HOTEL_SIGNS, demo_photo, demo_video
from tests.conftest import scalar
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration


def test_the_demos_photo_is_fetched_and_read(container):
    with demo_photo() as photo:
        [attachment] = photo.attachments
        assert container.settings.data_dir.resolve().as_uri() not in attachment.url
        driver = Driver(container)
        driver.publish([photo])
        driver.advance(photo.thread_id)
        assert driver.run_attachments() == ["done"]
    ocr = scalar(container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'")
    assert "Gate B17" in ocr and BOARDING_PASS[2] in ocr


def test_the_demos_video_is_read_scene_by_scene(container):
    with demo_video() as clip:
        driver = Driver(container)
        driver.publish([clip])
        driver.advance(clip.thread_id)
        assert driver.run_attachments() == ["done"]
    ocr = scalar(container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'")
    assert all(line.upper() in ocr.upper() for sign in HOTEL_SIGNS for line in sign), ocr
    assert scalar(container, "SELECT meta ->> 'speech' FROM artifacts") == "no sound track"
