"""Dates in chat text. Turns say "yesterday", "last Saturday" or "two weeks ago"; a question asks
about "7 May 2023". `find_dates` resolves the common English relative forms against the time the
message was sent, `annotate` writes the absolute date after each ("yesterday [7 May 2023]") for
the text that is indexed and embedded, and `query_period` reads the absolute date a question
names. Pure and clock-free: the same text and time always give the same answer, so a replay
indexes the same text.

Conventions where English is ambiguous: weeks run Monday to Sunday; "last Friday" is the most
recent Friday before the message's day, "next Friday" the first after it, "this Friday" the
coming one (or the day itself); "this weekend" is the one of the message's week, "last weekend"
the one before it; seasons are the northern meteorological ones (summer = June to August).
Vague forms ("recently", "a few days ago", "the other day") and bare weekdays or months ("on
Friday", "in March": past or future is unknown) are left alone."""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

# English names, whatever the process locale (calendar.month_name follows it).
_MONTH = ("January February March April May June July August September October November December").split()
_WEEKDAY = "monday tuesday wednesday thursday friday saturday sunday".split()
_SEASON_START = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}  # first month, 3 months long
_NUMBER = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a couple of": 2,
    "a couple": 2,
    "couple of": 2,
    "couple": 2,
}


@dataclass(frozen=True, slots=True)
class Period:
    """A span of days, both ends included, with how it reads ("7 May 2023", "April 2023")."""

    first: date
    last: date
    label: str

    def overlaps(self, first: date, last: date) -> bool:
        return self.first <= last and first <= self.last


@dataclass(frozen=True, slots=True)
class DateMention:
    start: int  # the phrase's span in the text
    end: int
    period: Period


# --- periods and their labels --------------------------------------------------------------------
def _day_label(d: date) -> str:
    return f"{d.day} {_MONTH[d.month - 1]} {d.year}"


def day(d: date) -> Period:
    return Period(d, d, _day_label(d))


def days(first: date, last: date) -> Period:
    if first.year != last.year:
        label = f"{_day_label(first)} to {_day_label(last)}"
    elif first.month != last.month:
        label = f"{first.day} {_MONTH[first.month - 1]} to {_day_label(last)}"
    else:
        label = f"{first.day} to {_day_label(last)}"
    return Period(first, last, label)


def month(year: int, m: int) -> Period:
    return Period(date(year, m, 1), date(year, m, calendar.monthrange(year, m)[1]), f"{_MONTH[m - 1]} {year}")


def months(year: int, m: int, count: int) -> Period:
    """`count` months from month `m` of `year` (a season)."""
    end_year, end_m = _shift_month(year, m, count - 1)
    first, last = month(year, m), month(end_year, end_m)
    head = _MONTH[m - 1] if year == end_year else first.label
    return Period(first.first, last.last, f"{head} to {last.label}")


def year(y: int) -> Period:
    return Period(date(y, 1, 1), date(y, 12, 31), str(y))


def _shift_month(y: int, m: int, delta: int) -> tuple[int, int]:
    index = y * 12 + (m - 1) + delta
    return index // 12, index % 12 + 1


def _week(d: date) -> Period:
    monday = d - timedelta(days=d.weekday())
    return days(monday, monday + timedelta(days=6))


def _weekend(saturday: date) -> Period:
    return days(saturday, saturday + timedelta(days=1))


# --- relative forms ------------------------------------------------------------------------------
_LAST = r"(?:last|this past|past)"
_NEXT = r"(?:next|this coming|coming)"
_WHICH = rf"(?P<which>{_LAST}|{_NEXT}|this)"
# The counts in words are the table's keys, so no form can match that it cannot read (as
# "couple" once did); the longest first, so that "a couple of" is not read as "a".
_COUNT = rf"(?P<n>\d{{1,2}}|{'|'.join(sorted(_NUMBER, key=len, reverse=True))})"
_UNIT = r"(?P<unit>day|week|month|year)s?"


def _direction(which: str) -> int:
    """-1 for last / this past / past, +1 for next / this coming / coming, 0 for this."""
    which = which.lower()
    if re.fullmatch(_LAST, which):
        return -1
    return 1 if re.fullmatch(_NEXT, which) else 0


def _offset_day(delta: int) -> Callable[[re.Match[str], date], Period]:
    return lambda _m, today: day(today + timedelta(days=delta))


def _weekday(m: re.Match[str], today: date) -> Period:
    target = _WEEKDAY.index(m["weekday"].lower())
    ahead = (target - today.weekday()) % 7  # 0 when it is today
    direction = _direction(m["which"])
    if direction < 0:
        return day(today - timedelta(days=(7 - ahead) % 7 or 7))
    if direction > 0:
        return day(today + timedelta(days=ahead or 7))
    return day(today + timedelta(days=ahead))


def _named_unit(m: re.Match[str], today: date) -> Period:
    direction, unit = _direction(m["which"]), m["unit"].lower()
    if unit == "week":
        return _week(today + timedelta(weeks=direction))
    if unit == "weekend":
        # The weekend of this week (the coming one, or the one we are in), then a week either way.
        saturday = today + timedelta(days=5 - today.weekday())
        return _weekend(saturday + timedelta(weeks=direction))
    if unit == "month":
        return month(*_shift_month(today.year, today.month, direction))
    return year(today.year + direction)


def _named_month(m: re.Match[str], today: date) -> Period:
    target = _MONTH.index(m["month"].capitalize()) + 1
    direction = _direction(m["which"])
    y = today.year
    if direction < 0 and target >= today.month:
        y -= 1
    elif direction > 0 and target <= today.month:
        y += 1
    return month(y, target)


def _season(m: re.Match[str], today: date) -> Period:
    start = _SEASON_START[m["season"].lower()]
    # Seasons by the year they start in; winter starts in December and runs into the next year.
    instances = [(y, months(y, start, 3)) for y in (today.year - 2, today.year - 1, today.year, today.year + 1)]
    direction = _direction(m["which"])
    if direction < 0:
        return [p for _, p in instances if p.last < today][-1]
    if direction > 0:
        return next(p for _, p in instances if p.first > today)
    current = [p for _, p in instances if p.first <= today <= p.last]
    return current[0] if current else next(p for y, p in instances if y == today.year)


def _count(m: re.Match[str]) -> int:
    n = m["n"].lower()
    return int(n) if n.isdigit() else _NUMBER[n]


def _shifted(m: re.Match[str], today: date, sign: int) -> Period:
    n, unit = _count(m) * sign, m["unit"].lower()
    if unit == "day":
        return day(today + timedelta(days=n))
    if unit == "week":
        return _week(today + timedelta(weeks=n))
    if unit == "month":
        return month(*_shift_month(today.year, today.month, n))
    return year(today.year + n)


_WEEKDAYS = "|".join(_WEEKDAY)
_MONTHS = "|".join(_MONTH)
_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], date], Period]], ...] = tuple(
    (re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE), resolve)
    for pattern, resolve in (
        (r"the day before yesterday", _offset_day(-2)),
        (r"the day after tomorrow", _offset_day(2)),
        (r"yesterday|last night", _offset_day(-1)),
        (r"today|tonight|this (?:morning|afternoon|evening)", _offset_day(0)),
        (r"tomorrow", _offset_day(1)),
        (rf"{_WHICH} (?P<weekday>{_WEEKDAYS})", _weekday),
        (rf"{_WHICH} (?P<unit>weekend|week|month|year)", _named_unit),
        (rf"{_WHICH} (?P<month>{_MONTHS})", _named_month),
        (rf"{_WHICH} (?P<season>spring|summer|fall|autumn|winter)", _season),
        (rf"{_COUNT} {_UNIT} ago", lambda m, today: _shifted(m, today, -1)),
        (rf"in {_COUNT} {_UNIT}", lambda m, today: _shifted(m, today, 1)),
        (rf"{_COUNT} {_UNIT} from now", lambda m, today: _shifted(m, today, 1)),
    )
)


def utc_day(at: datetime) -> date:
    """The day `at` falls on in UTC, whatever zone it was read in (a database session's TimeZone):
    a message's day, for the dates it names and for the day a question names. A naive time is
    taken as UTC."""
    return (at.astimezone(UTC) if at.tzinfo else at).date()


def find_dates(text: str, at: datetime | date) -> list[DateMention]:
    """The relative dates in `text`, resolved against the day `at` falls on (`utc_day`), in text
    order."""
    today = utc_day(at) if isinstance(at, datetime) else at
    found: list[tuple[int, int, Period]] = []
    for pattern, resolve in _RULES:
        for m in pattern.finditer(text):
            try:
                found.append((m.start(), m.end(), resolve(m, today)))
            except (ValueError, OverflowError):  # a day past the calendar's ends (years 1 and 9999)
                continue
    # Overlaps ("this past weekend" also holds "past weekend"): the earliest, then longest, wins.
    found.sort(key=lambda f: (f[0], -f[1]))
    mentions: list[DateMention] = []
    for start, end, period in found:
        if not mentions or start >= mentions[-1].end:
            mentions.append(DateMention(start, end, period))
    return mentions


def annotate(text: str, at: datetime | date) -> str:
    """`text` with each relative date followed by the absolute one: "yesterday [7 May 2023]"."""
    out, pos = [], 0
    for m in find_dates(text, at):
        out += [text[pos : m.end], f" [{m.period.label}]"]
        pos = m.end
    return "".join(out) + text[pos:]


def date_note(text: str, at: datetime | date) -> str:
    """The absolute dates of `text`'s relative ones, once each, "; "-separated ("" if none)."""
    return "; ".join(dict.fromkeys(m.period.label for m in find_dates(text, at)))


# --- absolute dates in questions -----------------------------------------------------------------
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_ORDINAL = r"(?:st|nd|rd|th)?"
_PART = {"beginning": 0, "start": 0, "early": 0, "middle": 1, "mid": 1, "end": 2, "late": 2}  # thirds of a month
_ABSOLUTE = tuple(
    re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE)
    for pattern in (
        rf"(?P<day>\d{{1,2}}){_ORDINAL}(?: of)? (?P<month>{_MONTHS}),? {_YEAR}",
        rf"(?P<month>{_MONTHS}) (?P<day>\d{{1,2}}){_ORDINAL},? {_YEAR}",
        rf"(?:(?:the )?(?P<part>{'|'.join(_PART)})(?: of)?[ -])?(?P<month>{_MONTHS}),? {_YEAR}",
    )
)


def query_period(text: str) -> Period | None:
    """The first absolute day or month a question names ("on 21 May, 2023", "in early November
    2022"), or None. A bare year is too broad to steer a search, so it is ignored."""
    found = sorted((m.start(), rule, m) for rule, pattern in enumerate(_ABSOLUTE) for m in pattern.finditer(text))
    for _, _, m in found:
        y, mo = int(m["year"]), _MONTH.index(m["month"].capitalize()) + 1
        groups = m.groupdict()
        if groups.get("day"):
            try:
                return day(date(y, mo, int(groups["day"])))
            except ValueError:  # "31 February"
                continue
        whole = month(y, mo)
        if not groups.get("part"):
            return whole
        third = _PART[groups["part"].lower()]
        first = whole.first + timedelta(days=10 * third)
        return days(first, whole.last if third == 2 else first + timedelta(days=9))
    return None
