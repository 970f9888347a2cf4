"""A hand-written check set of concatenated booking conversations (hotels, restaurants, trains,
taxis, attractions), which `make train-segmenter` writes in Def-DTS format for `chatmem bench
topicseg --data`. Evaluation only: the segmenter never trains on it.

Booking conversations differ from the development data in one way that matters here: one
conversation books several things ("Thanks. I also need a taxi to the station."), and a
task-oriented set counts the whole conversation as one segment, up to the user's closing
("Thank you, that's all I need."). A thanks that goes on with a request must not read as the end
of a task. As in booking corpora, the assistant asks for what it needs to know (area, day,
people), the user answers, the assistant offers and books, and the user sometimes asks a detail.
Templates cannot stand for real dialogues, so the figure is a check on that pattern
(docs/benchmarks.md), not an estimate of the task-oriented Score."""

from __future__ import annotations

from chatmem.bench.incar_dialogues import TemplateWriter, Turns, concatenated
from chatmem.bench.topicseg import Dialogue

SEED = 11
DIALOGUES = 200
CLOSED_SHARE = 0.85  # conversations that end with the user's closing exchange

AREAS = ["north", "south", "east", "west", "centre"]
FOODS = ["italian", "chinese", "indian", "british", "thai", "mexican", "french", "korean"]
HOTELS = ["the Acorn Guest House", "the Gonville Hotel", "Alexander B&B", "the Lensfield Hotel", "Hamilton Lodge"]
RESTAURANTS = ["Pizza Hut City Centre", "the Golden Curry", "Curry Garden", "Saigon City", "the Nirala"]
ATTRACTIONS = ["the Fitzwilliam Museum", "Kings College", "the Botanic Garden", "Cherry Hinton Water Play"]
KINDS = ["museum", "college", "park", "theatre", "swimming pool", "nightclub"]
CITIES = ["Cambridge", "London Kings Cross", "Ely", "Stevenage", "Norwich", "Peterborough", "Bishops Stortford"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TIMES = ["09:15", "10:30", "12:45", "14:00", "17:30", "19:15", "20:00"]
CARS = ["a white Toyota", "a black Skoda", "a red Ford", "a grey Volvo"]
LEADS = ("i need ", "i'm looking for ", "i want ", "i'd like to visit ")  # requests whose object an "also" takes


class _Booking(TemplateWriter):
    def hotel(self, also: bool) -> Turns:
        c, r = self.c, self.r
        area, name, nights = c(*AREAS), c(*HOTELS), r.randint(1, 5)
        return self._domain(
            also,
            ask=c(
                f"I'm looking for a place to stay in the {area}.",
                f"I need a {r.randint(2, 4)} star hotel with free parking.",
                "Can you help me find a guesthouse with free wifi?",
                "I need somewhere cheap to stay.",
            ),
            slots=[
                ("What area of town would you like to stay in?", f"The {area} please."),
                ("Do you have a price range in mind?", c("Something cheap.", "Moderate is fine.", "I don't mind.")),
            ],
            offer=f"{name} is a {c('cheap', 'moderately priced')} guesthouse in the {area}. Shall I book it?",
            book=f"Yes, please book it for {r.randint(1, 6)} people for {nights} nights from {c(*DAYS)}.",
            detail=c(
                ("Does it have free parking?", "Yes, it has free parking and wifi."),
                ("What is the postcode?", f"The postcode is CB{r.randint(1, 5)} {r.randint(1, 9)}{c('DF', 'QA')}."),
            ),
        )

    def restaurant(self, also: bool) -> Turns:
        c, r = self.c, self.r
        food, area, name = c(*FOODS), c(*AREAS), c(*RESTAURANTS)
        return self._domain(
            also,
            ask=c(
                f"I need a restaurant serving {food} food.",
                f"I'm looking for an expensive place to eat in the {area}.",
                f"Is there a cheap {food} restaurant in town?",
                "I want to find somewhere to have dinner.",
            ),
            slots=[
                ("What type of food would you like?", f"{food.capitalize()} food, please."),
                ("Which part of town?", f"In the {area}."),
            ],
            offer=f"{name} serves {food} food in the {area}. Would you like me to reserve a table?",
            book=f"Yes, a table for {r.randint(2, 8)} at {c(*TIMES)} on {c(*DAYS)}, please.",
            detail=c(
                ("What is the phone number?", f"The phone number is 01223 {r.randint(100000, 999999)}."),
                ("Can I get the address please?", f"It is at {r.randint(1, 99)} Regent Street."),
            ),
        )

    def train(self, also: bool) -> Turns:
        c, r = self.c, self.r
        (src, dst), day, at = r.sample(CITIES, 2), c(*DAYS), c(*TIMES)
        return self._domain(
            also,
            ask=c(
                f"I need a train to {dst}.",
                f"Are there any trains leaving {src} on {day}?",
                f"I'm looking for a train to {dst} that arrives by {at}.",
            ),
            slots=[
                ("Where will you be departing from?", f"I'll be leaving from {src}."),
                ("What day would you like to travel?", f"On {day}, after {c(*TIMES)}."),
            ],
            offer=f"TR{r.randint(1000, 9999)} leaves {src} at {at}, arriving in {dst} an hour later. Shall I book it?",
            book=f"Yes, please book {r.randint(1, 6)} tickets.",
            detail=c(
                ("How long is the journey?", f"The journey takes {r.randint(17, 88)} minutes."),
                ("What is the price per ticket?", f"Tickets are {r.randint(4, 30)} pounds each."),
            ),
        )

    def taxi(self, also: bool) -> Turns:
        c, r = self.c, self.r
        src, dst, at = c(*HOTELS), c(*ATTRACTIONS, *RESTAURANTS), c(*TIMES)
        return self._domain(
            also,
            ask=c(f"I need a taxi to {dst}.", f"Book me a taxi from {src}.", "I want a cab, please."),
            slots=[
                ("Where will you be leaving from?", f"From {src}."),
                ("What time would you like to be picked up?", f"At {at}, please."),
            ],
            offer=f"I can book {c(*CARS)} to take you to {dst} at {at}. Shall I go ahead?",
            book="Yes, please go ahead.",
            detail=("What is the contact number?", f"The contact number is 07{r.randint(100000000, 999999999)}."),
        )

    def attraction(self, also: bool) -> Turns:
        c = self.c
        kind, area, name = c(*KINDS), c(*AREAS), c(*ATTRACTIONS)
        return self._domain(
            also,
            ask=c(
                f"I'd like to visit a {kind}.",
                f"What attractions are there in the {area}?",
                f"I'm looking for a {kind} to go to.",
            ),
            slots=[("Do you have an area in mind?", f"The {area}, if possible.")],
            offer=f"{name} is a {kind} in the {area}, and entrance is {c('free', '5 pounds')}.",
            book="That sounds good.",
            detail=c(
                ("What are its opening hours?", f"It opens at {c(*TIMES)}."),
                ("Can I have the address?", f"It is on {c('Trumpington', 'Jesus', 'Hills')} Road."),
            ),
        )

    def _domain(
        self, also: bool, ask: str, slots: list[tuple[str, str]], offer: str, book: str, detail: tuple[str, str]
    ) -> Turns:
        """One thing booked: the request (after the first joined to the one before by an "also",
        often after a thanks), one or two questions of the assistant answered, the offer, the
        booking, and sometimes a detail asked."""
        if also:
            want = ask[0].lower() + ask[1:]
            lead = next((lead for lead in LEADS if want.startswith(lead)), None)
            if lead is None:  # a question or a plea: asked as it is
                ask = self.c(f"Thanks. Also, {want}", f"Also, {want}", f"Thank you! And {want}")
            else:
                thing = want.removeprefix(lead).rstrip(".")
                ask = self.c(
                    f"Thanks. I also need {thing}.",
                    f"Thank you! I'm also looking for {thing}.",
                    f"Great, thanks. Can you also find me {thing}?",
                    f"Yes, I also need {thing}.",
                )
        t: Turns = [("user", ask)]
        for question, answer in self.r.sample(slots, self.r.randint(1, len(slots))):
            t += [("assistant", question), ("user", answer)]
        t += [("assistant", offer), ("user", book)]
        done = self.c("Booking was successful.", "All set.", "Done.") + f" Your reference number is {self._ref()}."
        if self.r.random() < 0.4:
            t += [("assistant", done), ("user", detail[0]), ("assistant", detail[1])]
        else:
            t += [("assistant", done)]
        more = self.c("Is there anything else I can help you with?", "Anything else?", "")
        t[-1] = ("assistant", f"{t[-1][1]} {more}".rstrip())
        return t

    def _ref(self) -> str:
        return "".join(self.c(*"ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))

    def conversation(self) -> Turns:
        """One to three things booked in one conversation, usually ended by a closing exchange."""
        kinds = [self.hotel, self.restaurant, self.train, self.taxi, self.attraction]
        domains = self.r.sample(kinds, self.r.randint(1, 3))
        t: Turns = []
        for k, domain in enumerate(domains):
            t += domain(also=k > 0)
        if self.r.random() < CLOSED_SHARE:
            t += [
                (
                    "user",
                    self.c(
                        "Thank you, that's all I need.",
                        "No, that will be all. Thanks!",
                        "That's everything, thank you for your help.",
                        "Great, thanks. Goodbye.",
                        "No, I don't need anything else. Thank you!",
                    ),
                ),
                ("assistant", self.c("You're welcome. Have a great day!", "Thank you for using our service. Goodbye!")),
            ]
        return t


def dialogues(count: int = DIALOGUES, seed: int = SEED) -> list[Dialogue]:
    """`count` dialogues of 2-5 booking conversations each; each conversation is one gold segment."""
    w = _Booking(seed)
    return [concatenated(f"booking-{k}", [w.conversation() for _ in range(w.r.randint(2, 5))]) for k in range(count)]
