"""The photo `make run` sends is read by the attachments job as configured: the fetcher refuses
chatmem's own data folder, where the demo used to write it (its photo then failed, silently)."""

import pytest

from chatmem.api.demo import BOARDING_PASS, demo_photo
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
