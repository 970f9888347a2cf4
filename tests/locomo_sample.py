"""A small conversation in the LoCoMo file format (two sessions, an image turn, questions)."""

import json
from pathlib import Path

SAMPLE = [
    {
        "sample_id": "conv-test",
        "conversation": {
            "speaker_a": "Maya",
            "speaker_b": "Leo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Maya", "dia_id": "D1:1", "text": "Hey Leo! I finally adopted a rescue greyhound."},
                {"speaker": "Leo", "dia_id": "D1:2", "text": "Amazing! What is the dog called?"},
                {"speaker": "Maya", "dia_id": "D1:3", "text": "Her name is Pepper, she loves the beach."},
                {
                    "speaker": "Leo",
                    "dia_id": "D1:4",
                    "text": "Look at my new bike!",
                    "img_url": ["http://x/b.jpg"],
                    "blip_caption": "a photo of a red road bicycle leaning on a wall",
                },
            ],
            "session_2_date_time": "10:15 am on 20 June, 2023",
            "session_2": [
                {"speaker": "Leo", "dia_id": "D2:1", "text": "How was the pottery class last weekend?"},
                {"speaker": "Maya", "dia_id": "D2:2", "text": "I made a blue vase, my first one that did not crack."},
                {"speaker": "Leo", "dia_id": "D2:3", "text": "Nice, I am training for the Lisbon half marathon."},
            ],
            "session_3_date_time": "9:00 am on 1 July, 2023",
        },
        "qa": [
            {"question": "What is the name of Maya's dog?", "answer": "Pepper", "evidence": ["D1:3"], "category": 4},
            {
                "question": "What did Maya make in pottery class?",
                "answer": "a blue vase",
                "evidence": ["D2:2"],
                "category": 4,
            },
            {"question": "What colour is Leo's bicycle?", "answer": "red", "evidence": ["D1:4"], "category": 4},
        ],
    }
]


def write_sample(folder: Path, repeated_turn: bool = False) -> Path:
    """The sample as a file; `repeated_turn` adds a turn whose id an earlier turn already has."""
    sample = json.loads(json.dumps(SAMPLE))
    if repeated_turn:
        sample[0]["conversation"]["session_2"].append({"speaker": "Maya", "dia_id": "D2:3", "text": "Good luck!"})
    path = folder / "locomo_sample.json"
    path.write_text(json.dumps(sample))
    return path
