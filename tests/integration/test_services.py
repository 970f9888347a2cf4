import pytest

from chatmem.adapters import services
from chatmem.schemas.settings import Settings

pytestmark = pytest.mark.integration


def test_running_stops_only_what_it_launched(embedded, tmp_path):
    # The session's servers are already running under this data folder: used, not stopped.
    shared = Settings(data_dir=embedded["pg"].pgdata.parent)
    with services.running(shared) as urls:
        assert urls.redis_url == embedded["redis_url"]
    assert embedded["pg"].url() and embedded["redis"].url()

    # A fresh folder: launched here, so stopped again on the way out.
    own = Settings(data_dir=tmp_path / "own")
    with services.running(own) as urls:
        assert urls.database_url and urls.redis_url != embedded["redis_url"]
        pg, rd = services.embedded(own)
        assert pg.url() and rd.url()
    pg, rd = services.embedded(own)
    assert pg.url() is None and rd.url() is None
    assert [s.running for s in services.status(own)] == [False, False]
