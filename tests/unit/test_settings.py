import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from chatmem.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_environment_key_is_rejected(monkeypatch):
    monkeypatch.setenv("CHATMEM_DATABSE_URL", "postgresql://typo")
    with pytest.raises(ValidationError, match="CHATMEM_DATABSE_URL"):
        Settings()


def test_unknown_keyword_is_rejected():
    with pytest.raises(ValidationError):
        Settings(no_such_setting=1)


def test_environment_sets_typed_values(monkeypatch):
    monkeypatch.setenv("CHATMEM_MAX_TEXT_CHARS", "123")
    assert Settings().max_text_chars == 123
    monkeypatch.setenv("CHATMEM_MAX_TEXT_CHARS", "many")
    with pytest.raises(ValidationError, match="max_text_chars"):
        Settings()


def test_env_example_documents_every_setting_and_nothing_else():
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    documented = set(re.findall(r"^#?\s*(CHATMEM_[A-Z0-9_]+)=", text, flags=re.M))
    expected = {"CHATMEM_" + name.upper() for name in Settings.model_fields}
    assert documented == expected


def test_a_child_process_gets_secrets_in_clear_through_as_env():
    from chatmem.schemas.settings import Settings

    env = Settings(telegram_bot_token="123:abc").as_env({})
    assert env["CHATMEM_TELEGRAM_BOT_TOKEN"] == "123:abc"
    assert "123:abc" not in repr(Settings(telegram_bot_token="123:abc"))


def test_a_topic_shift_question_must_fit_in_the_threads_lease():
    assert Settings(segment_llm_assist=True).segment_llm_timeout_s * 6 <= Settings().thread_lease_s
    with pytest.raises(ValidationError, match="thread_lease_s / 6"):
        Settings(segment_llm_assist=True, segment_llm_timeout_s=30, thread_lease_s=120)
    assert Settings(segment_llm_timeout_s=30, thread_lease_s=120)  # off: not checked
