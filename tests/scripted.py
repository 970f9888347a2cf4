"""A scripted conversation with known episodes, shared by tests."""

from datetime import UTC, datetime, timedelta

from chatmem.schemas.events import CommandEvent, MessageEvent

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

SCRIPT = [
    # episode 1: trip planning
    (0, "user", "I am planning a trip to Lisbon in May and need help with the flights."),
    (1, "assistant", "Happy to help with your Lisbon flights. Where will you fly from?"),
    (2, "user", "From Berlin. I prefer morning departures and direct flights to Lisbon."),
    (3, "assistant", "There are direct morning flights from Berlin to Lisbon on most days in May."),
    # a digression, then back to the trip. The rule-based segmenter never split one; the learned
    # scorer is sure at once that the cat changes the topic. The assistant itself brings the talk
    # back ("Shall we continue ...?"), only user turns are candidates, and "Yes, book ..." answers
    # that question, so the scorer keeps the return with the digression (P(topic continues) 0.87
    # when its window closes, against a threshold of 0.65; docs/architecture.md, "Episodes")
    (4, "user", "My cat knocked over a plant this morning, what a mess."),
    (5, "assistant", "Oh no, cats can be chaotic. Shall we continue with the flights to Lisbon?"),
    (6, "user", "Yes, book the direct morning flight from Berlin to Lisbon on May 12."),
    (7, "assistant", "Done: the direct morning flight from Berlin to Lisbon on May 12 is booked."),
    # 8-hour gap: episode 2, still travel (the gap alone splits)
    (8 * 60 + 30, "user", "Now the hotel in Lisbon: something near Alfama under 150 euros a night."),
    (8 * 60 + 31, "assistant", "Here are three hotels near Alfama in Lisbon under 150 euros a night."),
    # persistent topic shift: episode 3 starts at the first shifted turn
    (8 * 60 + 32, "user", "My laptop keeps overheating when I compile large C++ projects."),
    (8 * 60 + 33, "assistant", "Overheating while compiling often comes from dust in the fans or a heavy load."),
    # The same laptop: no boundary. The scorer split here after the reply until it learned from
    # real task conversations, where a user's follow-up stays with its task (docs/benchmarks.md,
    # "Real task dialogues"); tests/integration/test_episodes.py holds it there
    (8 * 60 + 34, "user", "The laptop fan gets very loud and the CPU temperature reaches 95 degrees."),
    (8 * 60 + 35, "assistant", "At 95 degrees the CPU throttles; clean the fans and check the thermal paste."),
    # Russian marker: episode 4 at once
    (8 * 60 + 36, "user", "Кстати, какие документы нужны для визы в Японию?"),
    (8 * 60 + 37, "assistant", "Для визы в Японию обычно нужны паспорт, анкета и фотография."),
]
EXPECTED_STARTS = {  # seq -> opened_by, as the shipped scorer segments the script
    1: "first",
    5: "shift",
    9: "gap",
    11: "shift",
    15: "marker",
}
EXPECTED_EPISODES = [(1, 4), (5, 8), (9, 10), (11, 14), (15, None)]  # (start, end) seqs


def script_events(thread_id: str = "script", user_id: str = "alex") -> list[MessageEvent]:
    return [
        MessageEvent(
            event_id=f"{thread_id}-{i}",
            thread_id=thread_id,
            user_id=user_id,
            role=role,
            text=text,
            occurred_at=T0 + timedelta(minutes=minute),
            platform_message_id=f"m{i}",
        )
        for i, (minute, role, text) in enumerate(SCRIPT, start=1)
    ]


def command(thread_id: str, name: str, n: int, minute: int, user_id: str = "alex", **args) -> CommandEvent:
    return CommandEvent(
        event_id=f"{thread_id}-cmd-{n}",
        thread_id=thread_id,
        user_id=user_id,
        command=name,
        args=args,
        occurred_at=T0 + timedelta(minutes=minute),
    )
