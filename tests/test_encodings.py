"""A process's cells share their tokenised texts: the same texts, tokenizer and settings give the same encoding,
computed once; anything that would tokenise them otherwise is another encoding."""

from fedrepro.models.backbone import train_wordpiece
from fedrepro.models.relation import add_entity_markers
from fedrepro.tasks import encodings
from fedrepro.tasks.encodings import kept_encoding

TEXTS = ["premiums and riders", "a claim is filed", "the policy lapses"]


def test_the_same_texts_tokenizer_and_settings_are_encoded_once_anything_else_anew(monkeypatch):
    monkeypatch.setattr(encodings, "_kept", type(encodings._kept)())
    calls = []

    def encode(tokenizer, max_length):
        def run():
            calls.append(max_length)
            return [tokenizer(text, truncation=True, max_length=max_length)["input_ids"] for text in TEXTS]

        return run

    tokenizer = train_wordpiece(TEXTS, 60)
    first = kept_encoding(tokenizer, ("plain", 8), (TEXTS,), encode(tokenizer, 8))
    again = train_wordpiece(TEXTS, 60)  # another object, the same definition (a later cell loads it again)
    assert kept_encoding(again, ("plain", 8), (TEXTS,), encode(again, 8)) is first and calls == [8]
    assert kept_encoding(tokenizer, ("plain", 4), (TEXTS,), encode(tokenizer, 4)) is not first
    assert kept_encoding(tokenizer, ("plain", 8), (TEXTS[:2],), encode(tokenizer, 8)) is not first
    marked = train_wordpiece(TEXTS, 60)
    add_entity_markers(marked)
    assert kept_encoding(marked, ("plain", 8), (TEXTS,), encode(marked, 8)) is not first
    assert calls == [8, 4, 8, 8]


def test_no_more_than_the_kept_number_of_encodings_is_held(monkeypatch):
    monkeypatch.setattr(encodings, "_kept", type(encodings._kept)())
    tokenizer = train_wordpiece(TEXTS, 60)
    for length in range(encodings.KEPT + 5):
        kept_encoding(tokenizer, ("plain", length), (TEXTS,), lambda: [length])
    assert len(encodings._kept) == encodings.KEPT
