"""Relative dates resolved against the message time (memory/dates.py), and dates in questions."""

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatmem.memory.dates import annotate, date_note, find_dates, query_period

MONDAY = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # Monday 8 May 2023
SUNDAY = datetime(2023, 5, 14, 9, 0, tzinfo=UTC)


def labels(text: str, at: datetime = MONDAY) -> list[str]:
    return [m.period.label for m in find_dates(text, at)]


@pytest.mark.parametrize(
    ("phrase", "label"),
    [
        ("yesterday", "7 May 2023"),
        ("last night", "7 May 2023"),
        ("today", "8 May 2023"),
        ("tonight", "8 May 2023"),
        ("this morning", "8 May 2023"),
        ("tomorrow", "9 May 2023"),
        ("the day before yesterday", "6 May 2023"),
        ("the day after tomorrow", "10 May 2023"),
        ("last Saturday", "6 May 2023"),
        ("last Monday", "1 May 2023"),  # the day itself is not "last"
        ("this Monday", "8 May 2023"),
        ("this Friday", "12 May 2023"),
        ("next Monday", "15 May 2023"),
        ("this past Friday", "5 May 2023"),
        ("last week", "1 to 7 May 2023"),
        ("this week", "8 to 14 May 2023"),
        ("next week", "15 to 21 May 2023"),
        ("last weekend", "6 to 7 May 2023"),
        ("this weekend", "13 to 14 May 2023"),
        ("next weekend", "20 to 21 May 2023"),
        ("last month", "April 2023"),
        ("next month", "June 2023"),
        ("last year", "2022"),
        ("this year", "2023"),
        ("two days ago", "6 May 2023"),
        ("2 weeks ago", "24 to 30 April 2023"),
        ("a couple of weeks ago", "24 to 30 April 2023"),
        ("couple weeks ago", "24 to 30 April 2023"),  # once a KeyError that stopped the thread
        ("a couple days ago", "6 May 2023"),
        ("couple of days ago", "6 May 2023"),
        ("three months ago", "February 2023"),
        ("five years ago", "2018"),
        ("in two weeks", "22 to 28 May 2023"),
        ("in a month", "June 2023"),
        ("three days from now", "11 May 2023"),
        ("last summer", "June to August 2022"),
        ("this summer", "June to August 2023"),
        ("last winter", "December 2022 to February 2023"),
        ("next spring", "March to May 2024"),
        ("last March", "March 2023"),
        ("last May", "May 2022"),  # the current month is not "last"
        ("next January", "January 2024"),
    ],
)
def test_relative_forms_resolve_against_the_message_day(phrase, label):
    assert labels(f"I did it {phrase}, honestly.") == [label]


# Phrases shaped as the rules read them, from every word each part may be, among other words.
_COUNTS = ["a", "an", "one", "two", "twelve", "7", "12", "a couple", "couple", "a couple of", "couple of", "COUPLE"]
_UNITS = ["day", "days", "week", "weeks", "month", "months", "year", "years", "weekend"]
_WHICH = ["last", "this", "next", "this past", "past", "this coming", "coming"]
_NAMES = ["monday", "Sunday", "week", "weekend", "month", "year", "May", "december", "spring", "winter", "fall"]
_FIXED = ["the day before yesterday", "the day after tomorrow", "yesterday", "last night", "today", "tomorrow"]
_PHRASE = st.one_of(
    st.tuples(st.sampled_from(_COUNTS), st.sampled_from(_UNITS), st.sampled_from(["ago", "from now", ""])).map(
        " ".join
    ),
    st.tuples(st.just("in"), st.sampled_from(_COUNTS), st.sampled_from(_UNITS)).map(" ".join),
    st.tuples(st.sampled_from(_WHICH), st.sampled_from(_NAMES)).map(" ".join),
    st.sampled_from([*_FIXED, "and", "of", "ago", "in", ",", "\n", "the"]),
)
_EDGES = [datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 9, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, tzinfo=UTC)]


@settings(max_examples=400, deadline=None)
@given(
    words=st.lists(_PHRASE, max_size=8),
    at=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59), timezones=st.just(UTC))
    | st.sampled_from(_EDGES),
)
def test_any_phrase_the_rules_can_match_resolves_or_is_left_alone_at_any_time(words, at):
    # A message's dates are resolved as it is stored: an exception here would stop its thread.
    text = " ".join(words)
    mentions = find_dates(text, at)
    assert annotate(text, at).startswith(text[: mentions[0].end] if mentions else text)
    date_note(text, at)


def test_a_day_past_the_calendar_is_left_alone():
    assert labels("see you tomorrow", datetime(9999, 12, 31, tzinfo=UTC)) == []
    assert labels("see you yesterday and tomorrow", datetime(1, 1, 1, tzinfo=UTC)) == ["2 January 1"]


def test_case_and_position_do_not_matter():
    assert labels("Yesterday was long") == labels("it was long YESTERDAY") == ["7 May 2023"]


def test_on_a_sunday_last_weekend_is_the_one_before_and_this_weekend_is_today():
    assert labels("last weekend", SUNDAY) == ["6 to 7 May 2023"]
    assert labels("this weekend", SUNDAY) == ["13 to 14 May 2023"]


def test_months_and_years_roll_over():
    new_year = datetime(2023, 1, 2, tzinfo=UTC)
    assert labels("last month and last week", new_year) == ["December 2022", "26 December 2022 to 1 January 2023"]
    assert labels("next month", datetime(2023, 12, 31, tzinfo=UTC)) == ["January 2024"]


def test_vague_and_ambiguous_forms_are_left_alone():
    for text in ("recently", "the other day", "a few days ago", "on Friday", "in March", "last time we met"):
        assert find_dates(text, MONDAY) == [], text


def test_words_inside_other_words_do_not_match():
    assert find_dates("todays yesterdays nowhere weekender", MONDAY) == []


def test_the_longest_overlapping_phrase_wins():
    assert [(m.start, m.end) for m in find_dates("this past weekend", MONDAY)] == [(0, 17)]


def test_annotate_writes_the_absolute_date_after_each_phrase():
    text = "I ran a race last Saturday and rested yesterday."
    assert annotate(text, MONDAY) == "I ran a race last Saturday [6 May 2023] and rested yesterday [7 May 2023]."
    assert annotate("no dates here", MONDAY) == "no dates here"


def test_the_note_lists_each_date_once():
    assert date_note("yesterday, yes, yesterday; and last week", MONDAY) == "7 May 2023; 1 to 7 May 2023"
    assert date_note("nothing", MONDAY) == ""


def test_resolution_depends_only_on_text_and_time():
    # No clock: the same input gives the same output, which replay relies on.
    assert annotate("see you tomorrow", MONDAY) == annotate("see you tomorrow", MONDAY.replace(hour=23))
    assert find_dates("yesterday", date(2020, 3, 1))[0].period.first == date(2020, 2, 29)


def test_the_day_is_the_utc_day_whatever_zone_the_time_was_read_in():
    # 10:00 UTC on Monday 8 May is already Tuesday at UTC+14 and still Monday at UTC-10.
    for zone in ("Pacific/Kiritimati", "Pacific/Honolulu", "Asia/Kolkata"):
        local = MONDAY.replace(hour=10).astimezone(ZoneInfo(zone))
        assert date_note("yesterday", local) == "7 May 2023", zone


@pytest.mark.parametrize(
    ("question", "first", "last"),
    [
        ("What did John do on 21 May, 2023?", date(2023, 5, 21), date(2023, 5, 21)),
        ("on the 8th of December, 2023", date(2023, 12, 8), date(2023, 12, 8)),
        ("on May 7, 2023", date(2023, 5, 7), date(2023, 5, 7)),
        ("What happened in November 2022?", date(2022, 11, 1), date(2022, 11, 30)),
        ("in the beginning of November 2022", date(2022, 11, 1), date(2022, 11, 10)),
        ("in mid-March 2023", date(2023, 3, 11), date(2023, 3, 20)),
        ("late February 2024", date(2024, 2, 21), date(2024, 2, 29)),
    ],
)
def test_questions_name_days_and_months(question, first, last):
    period = query_period(question)
    assert period is not None and (period.first, period.last) == (first, last)


def test_questions_without_a_day_or_month_name_none():
    assert query_period("What did Anna say about the trip?") is None
    assert query_period("What happened in 2022?") is None  # a year is too broad to steer by
    assert query_period("on 31 February 2023") is not None  # read as the month
