"""A hand-written check set of concatenated in-car task dialogues (weather, navigation,
appointments), which `make train-segmenter` writes in Def-DTS format for `chatmem bench topicseg
--data`. Evaluation only: the segmenter never trains on it.

The development data hold no dialogue of this kind: short requests, each followed by zero to two
short follow-up questions ("Where is it?", "What about tomorrow?") and often a thanks, then the
next task. Templates cannot stand for real dialogues, so the figure is a check on that one
pattern (docs/benchmarks.md), not an estimate of the task-oriented Score."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from chatmem.bench.topicseg import Dialogue

SEED = 7
DIALOGUES = 200

CITIES = ["Durham", "Carson", "Boston", "Seattle", "Denver", "Austin", "Oakland", "Fresno", "Atlanta", "Miami"]
DAYS = ["today", "tomorrow", "this weekend", "on Monday", "on Friday", "this week", "tonight"]
WEATHER = ["rain", "snow", "sunshine", "fog", "wind", "clear skies", "a heatwave", "drizzle"]
POI_TYPES = [
    "gas station", "coffee shop", "grocery store", "hospital", "parking garage", "pizza place", "rest stop",
    "chinese restaurant",
]  # fmt: skip
POIS = [
    "Valero", "Starbucks", "Safeway", "Stanford Express Care", "Civic Center Garage", "Pizza My Heart",
    "Panda Express", "Chevron", "Whole Foods", "Philz Coffee",
]  # fmt: skip
STREETS = ["Main St", "El Camino Real", "Alma St", "Oak Rd", "Market Street", "5th Avenue", "Cedar Lane"]
PEOPLE = ["Ana", "my sister", "the dentist", "my boss", "Tom", "the team", "Dr. Lee"]
EVENTS = [
    "dinner", "a dentist appointment", "a meeting", "yoga class", "a tennis match", "lunch", "the conference call",
]  # fmt: skip
TIMES = ["7pm", "noon", "9am", "3:30pm", "8 in the morning", "6pm"]

Turns = list[tuple[str, str]]
T = TypeVar("T")


class TemplateWriter:
    """Random choices for template dialogues (shared with bench/booking_dialogues.py)."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def c(self, *options: T) -> T:
        return self.r.choice(options)

    def follow_ups(self, t: Turns, ask: Callable[[], str], answer: Callable[[], str]) -> Turns:
        """`t` and zero to two follow-up questions with their answers (each drawn afresh)."""
        for _ in range(self.r.randint(0, 2)):
            t += [("user", ask()), ("assistant", answer())]
        return t


class _InCar(TemplateWriter):
    def weather(self) -> Turns:
        c, r = self.c, self.r
        city, day, w = c(*CITIES), c(*DAYS), c(*WEATHER)
        ask = c(
            f"What is the weather going to be like in {city} {day}?",
            f"will it {c('rain', 'snow')} in {city} {day}",
            f"Check the forecast for {city} {day}.",
            f"is it going to be hot in {city} {day}?",
            f"whats the weather {day}",
        )
        t = [("user", ask), ("assistant", f"In {city} it will be {w} {day} with a high of {r.randint(40, 95)}F.")]
        return self.follow_ups(
            t,
            lambda: c(
                f"What about {c(*DAYS)}?",
                "Will I need an umbrella?",
                f"And in {c(*CITIES)}?",
                "How cold will it get at night?",
                "Is it going to be windy?",
                "what's the low temperature?",
            ),
            lambda: c(
                f"Expect {c(*WEATHER)} with a low of {r.randint(20, 60)}F.",
                "No, it should stay dry.",
                f"Yes, {c(*WEATHER)} is expected.",
            ),
        )

    def navigation(self) -> Turns:
        c, r = self.c, self.r
        poi, kind = c(*POIS), c(*POI_TYPES)
        ask = c(
            f"Find me the nearest {kind}.",
            f"I need to get to a {kind}, where is the closest one?",
            f"Take me to {poi}.",
            f"where's a {kind} near me",
            f"give me directions to the closest {kind} please",
        )
        where = f"{poi} is {r.randint(1, 6)} miles away at {r.randint(100, 999)} {c(*STREETS)}."
        return self.follow_ups(
            [("user", ask), ("assistant", where)],
            lambda: c(
                "Is there any traffic on the way?",
                "What's the address?",
                "Pick the quickest route.",
                "Is there one closer?",
                "ok set the route",
                "How long will it take to get there?",
            ),
            lambda: c(
                "There is moderate traffic, I chose a route avoiding it.",
                f"It's at {r.randint(100, 999)} {c(*STREETS)}.",
                "Route set, you'll be there in 12 minutes.",
                "That is the closest one.",
            ),
        )

    def appointment(self) -> Turns:
        c, r = self.c, self.r
        event, who, at = c(*EVENTS), c(*PEOPLE), c(*TIMES)
        ask = c(
            f"When is my {event.removeprefix('a ')}?",
            f"Schedule {event} with {who} {c(*DAYS)} at {at}.",
            f"Book a table for {r.randint(2, 6)} at {c(*POIS)} at {at}.",
            f"Remind me about {event} {c(*DAYS)}.",
            f"do i have anything scheduled {c(*DAYS)}?",
        )
        answer = c(
            f"Your {event.removeprefix('a ')} is {c(*DAYS)} at {at} with {who}.",
            f"Done, {event} with {who} is set for {at}.",
            "Your table is booked.",
            f"You have {event} at {at}.",
        )
        return self.follow_ups(
            [("user", ask), ("assistant", answer)],
            lambda: c(
                "Who is attending?",
                "Can you move it to an hour later?",
                "Where is it?",
                "Add a reminder an hour before.",
                "What time does it start?",
            ),
            lambda: c(
                f"{who} will attend.",
                "Moved.",
                f"It is at {r.randint(100, 999)} {c(*STREETS)}.",
                "Reminder added.",
                f"It starts at {at}.",
            ),
        )

    def task(self) -> Turns:
        t = self.c(self.weather, self.navigation, self.appointment)()
        if self.r.random() < 0.6:
            thanks = self.c(
                "Thanks!", "thank you", "great, thanks", "ok thank you, that's all", "perfect, thanks a lot"
            )
            welcome = self.c("You're welcome!", "Happy to help.", "Anytime!", "Drive safe!")
            t += [("user", thanks), ("assistant", welcome)]
        return t


def concatenated(dialogue_id: str, tasks: list[Turns]) -> Dialogue:
    """The tasks one after another, each one gold segment."""
    roles: list[str] = []
    texts: list[str] = []
    ends: list[int] = []
    for task in tasks:
        roles += [role for role, _ in task]
        texts += [text for _, text in task]
        ends += [0] * (len(task) - 1) + [1]
    ends[-1] = 0
    return Dialogue(dialogue_id, roles, texts, ends)


def dialogues(count: int = DIALOGUES, seed: int = SEED) -> list[Dialogue]:
    """`count` dialogues of 3-6 tasks each; each task is one gold segment."""
    w = _InCar(seed)
    return [concatenated(f"task-{k}", [w.task() for _ in range(w.r.randint(3, 6))]) for k in range(count)]
