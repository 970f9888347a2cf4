import pytest

from chatmem.memory.facts import extract, from_remember, resolve


def kinds(text):
    return [(f.category, f.key, f.value) for f in extract(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My name is Alex", [("identity", "name", "Alex")]),
        ("my full name is Alexander.", [("identity", "name", "Alexander")]),
        ("I live in Berlin, near the park.", [("identity", "location", "Berlin")]),
        ("I'm allergic to peanuts.", [("constraint", "peanuts", "peanuts")]),
        ("I prefer morning departures.", [("preference", "morning departures", "morning departures")]),
        ("Always answer in English.", [("instruction", "answer english", "answer in English")]),
        ("We decided to take the train.", [("decision", "take train", "take the train")]),
        ("Меня зовут Боб, я живу в Риге.", [("identity", "name", "Боб"), ("identity", "location", "Риге")]),
        ("У меня аллергия на орехи.", [("constraint", "орехи", "орехи")]),
    ],
)
def test_statements_become_facts(text, expected):
    assert kinds(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Hi!",
        "Thanks",
        "Привет",
        "What is my name?",
        "Maybe I live in Paris.",
        "I think I prefer tea.",
        "Может быть, я живу в Москве.",
        "The weather is nice today.",
    ],
)
def test_greetings_questions_and_speculation_are_not_facts(text):
    assert extract(text) == []


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        ("I\u2019m allergic to peanuts.", "I'm allergic to peanuts."),  # a phone's keyboard types \u2019
        ("I don\u2019t eat pork.", "I don't eat pork."),
        ("Don\u02bct ever reply in French.", "Don't ever reply in French."),
        ("i 'm based in Oslo .", "I'm based in Oslo."),  # a tokeniser's split contraction
    ],
)
def test_typographic_apostrophes_and_split_contractions_state_the_same_fact(typed, plain):
    facts = extract(typed)
    assert kinds(typed) == kinds(plain) != []
    assert facts[0].text == typed.strip()  # the sentence is kept as written


def test_assistant_lines_are_never_facts_about_the_user():
    assert extract("My name is Assistant.", speaker_is_user=False) == []


def test_confidence_orders_name_statements():
    (name,) = extract("My name is Alex")
    (nick,) = extract("call me Al")
    (full,) = extract("my full name is Alexander")
    assert nick.confidence < name.confidence < full.confidence


def test_resolution_keeps_one_value_by_confidence():
    assert resolve(0.9, None, False).action == "insert"
    assert resolve(0.6, 0.9, False).action == "keep_old"
    assert resolve(0.9, 0.9, False).action == "replace"  # at least as confident: the newer wins
    assert resolve(0.95, 0.9, True).action == "same"


def test_remember_is_explicit_and_certain():
    recognised = from_remember("My name is Dana")
    assert (recognised.category, recognised.key, recognised.confidence) == ("identity", "name", 1.0)
    free = from_remember("The wifi password is on the fridge")
    assert free.category == "instruction" and free.confidence == 1.0 and free.value.startswith("The wifi")
