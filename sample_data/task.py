"""Synthetic arithmetic word problems with worked, column-by-column solutions (the sample task's generator).

Five problem kinds (add, subtract, multiply, two-step, temperature with negative results). Every response ends
with a final line ``Answer: <integer>``; `rcdiag.score.sample.reward` checks it. Phrasing varies at random so that a
trained model keeps real choices (a long tail of next-token probabilities) rather than one fixed string.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

HE = ("Tom Sam Ben Max Leo Jack Noah Liam Omar Ivan Hugo Luca Adam Eli Finn Owen Ryan Paul Mark Carl Theo Jonas "
      "Felix Oscar Henry Arthur Victor Diego Mateo Pablo Tariq Kenji Hiro Ravi Arjun Dev Kofi Musa Emeka Yusuf "
      "Bruno Anton Pedro Rafael Samuel Daniel Joseph David Peter George Edward Walter Frank Harold Simon Nils "
      "Lars Sven Erik Olaf Dmitri Boris Yuri Milo Rowan Ezra Caleb Isaac Julian Marco Enzo Nico Aiden Ahmed Bilal "
      "Chidi Dario Emil Fabian Gustav Hamza Ibrahim Jasper Kasimir Lorenzo Malik Nikolai Orlando Quentin Rashid "
      "Santiago Tobias Ulrich Vincent Wilhelm Xavier Yannick Zoltan Ansel Benedikt Cosmo Dorian Evander Gideon "
      "Horatio Ignatius Jerome Killian Leopold Magnus Nathaniel Octavio Percival Reginald Sebastian Thaddeus "
      "Valentin Winston Barnaby Cornelius Desmond Ferdinand Gregor Humphrey Lysander Montgomery Ptolemy Rupert "
      "Sylvester Tiberius Augustin Balthazar Casimir Emeric Florian Gaspard Hilario Joaquin Leandro Marcelo").split()
SHE = ("Anna Mia Emma Lily Zoe Ella Ava Maya Nora Ruth Sara Lucy Iris Jane Kate Rosa Alice Clara Julia Laura "
       "Sofia Elena Hana Yuki Mei Priya Aisha Fatima Amara Zara Leila Nadia Olga Irina Greta Heidi Ingrid Astrid "
       "Chloe Grace Hannah Emily Olivia Amelia Isabel Lucia Paula Marta Beatriz Camila Valeria Daniela Gabriela "
       "Helen Diana Fiona Molly Holly Daisy Poppy Ruby Violet Hazel Stella Luna Aurora Naomi Esther Miriam Adelaide "
       "Beatrix Cordelia Dorothea Eleanor Florence Georgina Henrietta Isadora Josephine Katarina Lavinia Magdalena "
       "Nicoletta Ophelia Penelope Rosalind Seraphina Theodora Ursula Veronica Wilhelmina Yolanda Zenobia Annika "
       "Brigitte Cecilia Delphine Evangeline Francesca Gwendolyn Harriet Imogen Jacqueline Leonora Marguerite "
       "Natasha Octavia Philippa Rebecca Susannah Tatiana Vivienne Winifred Xiomara Bernadette Constance "
       "Esmeralda Felicity Genevieve Hortense Juliana Kassandra Lucinda Matilda Nerissa Rosamund Svetlana").split()
ITEMS = ("apples pears plums oranges lemons cherries grapes peaches melons bananas carrots potatoes onions "
         "tomatoes beans eggs cookies cakes muffins candies pencils pens crayons markers books comics stickers "
         "stamps cards marbles buttons beads shells stones coins tickets balloons candles flowers roses tulips "
         "daisies seeds nuts acorns feathers ribbons socks shirts hats toys puzzles blocks bricks bottles cups "
         "plates bowls spoons forks jars boxes bags baskets nails screws bolts tiles songs photos letters "
         "postcards envelopes magnets batteries bulbs lamps chairs tables pumpkins cucumbers radishes turnips "
         "parsnips avocados apricots coconuts pineapples strawberries blueberries raspberries walnuts almonds "
         "pistachios chestnuts pebbles crystals diamonds emeralds sapphires lanterns umbrellas blankets pillows "
         "notebooks keychains bracelets necklaces earrings trumpets violins drums guitars kites robots "
         "dinosaurs rockets bicycles scooters skateboards helmets sandwiches pancakes waffles doughnuts pretzels "
         "biscuits croissants dumplings lollipops chocolates cupcakes brownies seashells starfish pinecones "
         "sunflowers lavender orchids dandelions mushrooms snowballs paperclips thumbtacks sketchbooks paintbrushes "
         "calculators telescopes microscopes compasses thermometers hourglasses lightbulbs").split()
PLACES = ("at the market|at the shop|at the fair|from a friend|at the bakery|at the corner store|online|"
          "at the school sale|at the farm|at the harbour|in the village|at the station|at the supermarket|"
          "at the museum gift shop|at the garden centre|at the flea market|at the hardware store|at the pharmacy|"
          "at the bookshop|at the toy store|at the stationery shop|at the greengrocer|at the festival|"
          "at the airport|at the library sale|at the boutique|at the auction|at the carnival").split("|")
FALL = ("fell|dropped|went down").split("|")


@dataclass(frozen=True)
class Example:
    """One task instance: the user prompt, a worked response ending in ``Answer: N``, and the integer answer."""

    prompt: str
    response: str
    answer: int


def _digits(n: int) -> list[int]:
    """Decimal digits of n ≥ 0, ones first."""
    return [int(c) for c in reversed(str(n))] or [0]


PLACE_NAMES = ("ones", "tens", "hundreds", "thousands")


def column_add(a: int, b: int) -> list[str]:
    """Lines of a column addition a + b (a, b ≥ 0), ones first, naming each carry."""
    da, db = _digits(a), _digits(b)
    lines, carry = [], 0
    for i in range(max(len(da), len(db))):
        x, y = (da[i] if i < len(da) else 0), (db[i] if i < len(db) else 0)
        s = x + y + carry
        terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
        note = f", write {s % 10}, carry {s // 10}" if s >= 10 else ""
        lines.append(f"{PLACE_NAMES[i].capitalize()}: {terms} = {s}{note}.")
        carry = s // 10
    if carry:
        lines.append(f"Carry {carry} into the {PLACE_NAMES[len(lines)]}.")
    lines.append(f"So {a} + {b} = {a + b}.")
    return lines


def column_sub(a: int, b: int) -> list[str]:
    """Lines of a column subtraction a - b (a ≥ b ≥ 0), ones first, naming each borrow."""
    da, db = _digits(a), _digits(b)
    lines, borrow = [], 0
    for i in range(len(da)):
        x, y = da[i] - borrow, (db[i] if i < len(db) else 0)
        if i >= len(db) and borrow == 0 and i > 0:
            break
        top = f"{da[i]} - {borrow}" if borrow else f"{da[i]}"
        if x < y:
            lines.append(f"{PLACE_NAMES[i].capitalize()}: {top} is less than {y}, borrow 1: {x + 10} - {y} = {x + 10 - y}.")
            borrow = 1
        else:
            lines.append(f"{PLACE_NAMES[i].capitalize()}: {top} - {y} = {x - y}." if y or borrow
                         else f"{PLACE_NAMES[i].capitalize()}: {x} - 0 = {x}.")
            borrow = 0
    lines.append(f"So {a} - {b} = {a - b}.")
    return lines


def split_mul(k: int, b: int) -> list[str]:
    """Lines of k × b for a one-digit k by splitting b into tens and ones, then adding the parts in columns."""
    tens, ones = b - b % 10, b % 10
    lines = [f"Split {b} into {tens} and {ones}.", f"{k} × {tens} = {k * tens} and {k} × {ones} = {k * ones}."]
    lines += column_add(k * tens, k * ones)[:-1]
    lines.append(f"So {k} × {b} = {k * b}.")
    return lines


def _who(rng: random.Random) -> tuple[str, str]:
    """A random name and its pronoun."""
    return (rng.choice(HE), "he") if rng.random() < 0.5 else (rng.choice(SHE), "she")


def _num(rng: random.Random, lo: int = 10, hi: int = 99, big: float = 0.2) -> int:
    """A 2-digit number, or with probability `big` a 3-digit one."""
    return rng.randint(100, 999) if rng.random() < big else rng.randint(lo, hi)


def _finish(rng: random.Random, lead: str, items: str, lines: list[str], ans: int) -> str:
    """Join the worked lines with a restated result (e.g. "In total there are 42 apples.") and the Answer line."""
    end = rng.choice([f"{lead} {ans} {items}.", f"That makes {ans} {items}.", f"The result is {ans}."])
    return "\n".join(lines + [end, f"Answer: {ans}"])


def make_add(rng: random.Random) -> Example:
    name, p = _who(rng)
    items, a, b = rng.choice(ITEMS), _num(rng), _num(rng)
    prompt = rng.choice([
        f"{name} has {a} {items} and buys {b} more {rng.choice(PLACES)}. How many {items} does {p} have now?",
        f"{name} had {a} {items}. Then {p} got {b} more {rng.choice(PLACES)}. How many {items} does {name} have?",
        f"There are {a} {items} in a box. {name} puts in {b} more. How many {items} are in the box now?"])
    head = [rng.choice([f"We start with {a} {items} and add {b}.", f"We need {a} + {b}.",
                        f"This is an addition: {a} + {b}."])]
    return Example(prompt, _finish(rng, "In total there are", items, head + column_add(a, b), a + b), a + b)


def make_sub(rng: random.Random) -> Example:
    name, p = _who(rng)
    friend = rng.choice(HE + SHE)
    items, a = rng.choice(ITEMS), _num(rng, 20, 99, 0.25)
    b = rng.randint(1, a - 1)
    prompt = rng.choice([
        f"{name} has {a} {items} and gives {b} of them to {friend}. How many {items} does {name} have left?",
        f"{name} had {a} {items}, but {b} were lost. How many {items} are left?",
        f"A shelf holds {a} {items}. {name} takes away {b}. How many {items} stay on the shelf?"])
    head = [rng.choice([f"We take {b} away from {a}.", f"We need {a} - {b}.", f"This is a subtraction: {a} - {b}."])]
    return Example(prompt, _finish(rng, "Now there are", items, head + column_sub(a, b), a - b), a - b)


def make_mul(rng: random.Random) -> Example:
    name, p = _who(rng)
    items, k, b = rng.choice(ITEMS), rng.randint(2, 9), rng.randint(11, 99)
    prompt = rng.choice([
        f"{name} buys {k} bags of {items}. Each bag has {b} {items}. How many {items} does {p} buy in all?",
        f"There are {k} rows with {b} {items} in each row. How many {items} are there altogether?"])
    head = [rng.choice([f"We need {k} × {b}.", f"{k} groups of {b} is {k} × {b}."])]
    return Example(prompt, _finish(rng, "Altogether there are", items, head + split_mul(k, b), k * b), k * b)


def make_two_step(rng: random.Random) -> Example:
    name, p = _who(rng)
    friend = rng.choice(HE + SHE)
    items, a, b = rng.choice(ITEMS), _num(rng, 10, 99, 0.1), rng.randint(10, 99)
    c = rng.randint(1, a + b - 1)
    prompt = (f"{name} has {a} {items}. {p.capitalize()} buys {b} more and then gives {c} to {friend}. "
              f"How many {items} does {name} have now?")
    lines = [f"First add: {a} + {b}."] + column_add(a, b) + [f"Then subtract: {a + b} - {c}."] + column_sub(a + b, c)
    return Example(prompt, _finish(rng, f"{name} has", items, lines, a + b - c), a + b - c)


def make_temperature(rng: random.Random) -> Example:
    a, b = rng.randint(-15, 30), rng.randint(1, 35)
    place = rng.choice(("Oslo", "a small town", "the mountains", "the desert", "a village", "the city"))
    prompt = (f"In {place} the temperature was {a} degrees in the morning. By night it {rng.choice(FALL)} "
              f"by {b} degrees. What was the temperature at night?")
    r = a - b
    if a >= b:
        lines = [f"We need {a} - {b}."] + column_sub(a, b)
    elif a >= 0:
        lines = [f"We need {a} - {b}. Since {b} is more than {a}, the result is below zero.",
                 f"{b} - {a} = {b - a}, so {a} - {b} = {r}."]
    else:
        lines = [f"We need {a} - {b}. Both move below zero, so we add the sizes.",
                 f"{-a} + {b} = {b - a}, so {a} - {b} = {r}."]
    return Example(prompt, "\n".join(lines + [f"At night it was {r} degrees.", f"Answer: {r}"]), r)


KINDS: dict[str, Callable[[random.Random], Example]] = {
    "add": make_add, "sub": make_sub, "mul": make_mul, "two_step": make_two_step, "temperature": make_temperature}
WEIGHTS = {"add": 0.27, "sub": 0.27, "mul": 0.18, "two_step": 0.14, "temperature": 0.14}


def sample(rng: random.Random) -> Example:
    """One random example; the kind is drawn with WEIGHTS."""
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    return KINDS[kind](rng)


def stream(seed: int, exclude: frozenset[str] = frozenset()) -> Iterator[Example]:
    """Endless examples from `seed`, skipping any whose prompt is in `exclude` (the held-out set)."""
    rng = random.Random(seed)
    while True:
        ex = sample(rng)
        if ex.prompt not in exclude:
            yield ex


def held_out(seed: int, n: int) -> list[Example]:
    """`n` examples with distinct prompts, drawn from `seed`."""
    seen: dict[str, Example] = {}
    for ex in stream(seed):
        seen.setdefault(ex.prompt, ex)
        if len(seen) == n:
            return list(seen.values())
    raise AssertionError("unreachable")
