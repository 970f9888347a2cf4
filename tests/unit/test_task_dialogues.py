"""The real task dialogues the segmenter learns from and is checked on (bench/task_dialogues.py)."""

import json
from pathlib import Path

from chatmem.bench import task_dialogues as td


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _dialogue(did: str, service: str, n: int = 4) -> dict:
    turns = [
        {"speaker": "USER" if i % 2 == 0 else "SYSTEM", "utterance": f"{service} {did} turn  {i}\n"} for i in range(n)
    ]
    return {"dialogue_id": did, "services": [service], "turns": turns}


def test_a_single_service_dialogue_is_one_segment_with_its_roles_and_words(tmp_path: Path):
    rows = [
        _dialogue("1_1", "Restaurants_2"),
        {**_dialogue("1_2", "Hotels_1"), "services": ["Hotels_1", "Flights_2"]},  # two tasks: left out
        _dialogue("1_3", "Weather_1", n=1),  # nothing to segment: left out
    ]
    loaded = td.load(_write(tmp_path / "d.jsonl", rows))
    assert [(domain, d.id) for domain, d in loaded] == [("Restaurants", "sgd-1_1")]
    d = loaded[0][1]
    assert d.roles == ["user", "assistant", "user", "assistant"]
    assert d.texts[0] == "Restaurants_2 1_1 turn 0" and d.ends_segment == [0, 0, 0, 0]


def test_the_check_set_uses_every_dialogue_once_and_changes_domain_at_each_boundary(tmp_path: Path):
    services = ["Restaurants_1", "Restaurants_2", "Hotels_1", "Weather_1", "Flights_4", "Homes_2"]
    rows = [_dialogue(f"x_{k}", services[k % len(services)], n=2 + 2 * (k % 3)) for k in range(40)]
    path = _write(tmp_path / "d.jsonl", rows)
    joined = td.check_set(path)
    assert joined == td.check_set(path)  # a fixed seed
    texts = [t for d in joined for t in d.texts]
    assert len(texts) == len(set(texts))  # no dialogue twice
    assert set(texts) <= {" ".join(t["utterance"].split()) for r in rows for t in r["turns"]}
    assert len({t.split()[1] for t in texts}) >= len(rows) - 1  # at most one left over
    for d in joined:
        starts = [0] + [i + 1 for i, e in enumerate(d.ends_segment) if e]
        domains = [d.texts[s].split("_")[0] for s in starts]
        assert 2 <= len(starts) <= 5 and all(a != b for a, b in zip(domains, domains[1:], strict=False))
        assert all(d.roles[s] == "user" for s in starts) and d.ends_segment[-1] == 0


def test_the_packaged_files_hold_real_dialogues_apart():
    train = td.load(td.packaged(td.TRAIN_FILE))
    check = td.load(td.packaged(td.CHECK_FILE))
    assert len(train) > 150 and len(check) > 150
    assert len({domain for domain, _ in train}) >= 6 and len({domain for domain, _ in check}) >= 10
    # Never a dialogue of the check set among those trained on.
    assert not {tuple(d.texts) for _, d in train} & {tuple(d.texts) for _, d in check}
    joined = td.check_set(td.packaged(td.CHECK_FILE))
    assert len(joined) > 40 and sum(sum(d.ends_segment) for d in joined) > 100
