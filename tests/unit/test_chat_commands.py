"""The shared chat command layer: /forget_me erases only when confirmed in the same message."""

from datetime import UTC, datetime

from chatmem.producers.chat import ChatCommand, Origin, command_event, command_reply, parse_command

ORIGIN = Origin("e1", "telegram:1", "telegram:7", "telegram", datetime(2026, 1, 1, tzinfo=UTC))


def test_forget_me_without_confirmation_publishes_nothing_and_explains():
    command, arg = parse_command("/forget_me")
    assert command is ChatCommand.FORGET_ME and command_event(ORIGIN, command, arg) is None
    assert "/forget_me yes" in command_reply(None, command, arg, thread_id="telegram:1", user_id="telegram:7")


def test_confirmed_forget_me_becomes_a_forget_me_command_event():
    command, arg = parse_command("/forget_me@my_bot YES", "my_bot")
    event = command_event(ORIGIN, command, arg)
    assert event is not None and event.command == "forget_me" and event.user_id == "telegram:7"
    assert "cannot be undone" in command_reply(None, command, arg, thread_id="telegram:1", user_id="telegram:7")


def test_a_nul_in_a_commands_text_is_dropped_as_in_message_text():
    # The event refuses NUL in a command's arguments; a bot's handler must not fail on it.
    command, arg = parse_command("/remember I like\x00 green tea")
    event = command_event(ORIGIN, command, arg)
    assert event is not None and event.args == {"text": "I like green tea"}
