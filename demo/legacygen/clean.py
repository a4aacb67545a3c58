"""The clean part of the synthetic legacy data set: realistic rows, all of them valid.

Users signing up over four years (in same-second bursts now and then), power-law boards,
pins and follows (a few very hot boards), group boards, sparse IDs with some of 2**36 and
above, and unicode edge cases in every text field. Everything comes from one
``random.Random``, so one seed always gives the same rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter

from loaders.migration.legacy_schema import LEGACY_TABLES

EPOCH = 1267401600             # 2010-03-01T00:00:00Z
DAY = 86400
HIGH_ID = 1 << 36              # legacy IDs from here on do not fit a 36-bit local ID
MAX_ID = (1 << 64) - 1

FIRST = ("Anna", "José", "Zoë", "Łukasz", "Søren", "Ngozi", "Björk", "Mei", "Ana María",
         "Jean-Luc", "Aoife", "Đặng", "Ахмед", "Priya", "Kwame", "Ólafur", "Sarah", "Tom",
         "Emily", "Mohammed", "Yuki", "Chloé", "İbrahim", "Grete")
LAST = ("O'Brien", "Müller", "Nguyễn", "García", "van der Berg", "Smith", "李", "山田",
        "Ødegaard", "D'Angelo", "Johnson", "Kowalski", "Ndiaye", "Papadopoulos", "Straße")
ODD_NAMES = ('Ann "Annie" Lee', "C:\\Users\\bob", "Mary\nJane", "Nul\x00Byte", "🌸 Sakura 🌸",
             "Pin 📌 Queen 👑", "back\\slash\\", "tab\there", "  padded  ", "‮RTL override",
             "Z̷a̶l̸g̵o", "😀😃😄", "Robert'); DROP TABLE users;--", "\\N", "🧗‍♀️ climber",
             "مريم", "line\r\nbreak", "\x00")
HANDLES = ("anna", "Jose", "zoë", "ŁUKASZ", "søren", "PinLover", "DIYqueen", "chef", "ナオミ",
           "müller", "crafty", "🌸flower", "NGOZI", "b.jörk", "MixedCase", "straße", "user")
DOMAINS = ("gmail.com", "Yahoo.com", "example.org", "HOTMAIL.COM", "mail.example.net")
TOPICS = ("Recipes 🍰", "Home décor", "DIY", "Wedding ideas 💍", 'Mom\'s "best" recipes',
          "Travel ✈️", "Garden", "Quotes", "Style", "Cats 🐈", "Tattoos", "Art", "Kids",
          "Fitness 💪", "Christmas 🎄", "Crafts", "Books 📚", "Photography", "Cars", "Tiny houses")
WORDS = ("the", "a", "love", "this", "easy", "recipe", "idea", "for", "my", "new", "so",
         "cute", "best", "DIY", "home", "with", "and", "summer", "party", "😍", "🔥", "❤️",
         "café", "naïve", "größer", "日本", "très", "jolie", "🙌🏽", "must", "try", "!!!",
         "it's", '"quoted"', "C:\\path", "#inspo", "über", "señor", "piñata", "👩‍👩‍👧")


def _phrases(rng: random.Random) -> list[str]:
    """4,096 phrases of 1-10 words; one in 200 ends in a NUL, newline, tab or backslash."""
    out = [" ".join(rng.choices(WORDS, k=rng.randint(1, 10))) for _ in range(4096)]
    for i in rng.sample(range(4096), 20):
        out[i] += rng.choice(("\x00", "\nsecond line", " \\ ", "\t", "\r\n"))
    return out


def _lomax(rng: random.Random, mean: float, cap: int, alpha: float = 2.2) -> int:
    """A heavy-tailed count with roughly the given mean, at most ``cap``."""
    return min(cap, int(mean * (alpha - 1) * (rng.paretovariate(alpha) - 1) + 0.5))


def _zipf(rng: random.Random, n: int, s: float) -> tuple[list[float], list[int]]:
    """Cumulative Zipf weights over ``n`` items, and each item's (shuffled) popularity rank."""
    ranks = list(range(1, n + 1))
    rng.shuffle(ranks)
    return list(accumulate(r ** -s for r in ranks)), ranks


def _sparse_ids(rng: random.Random, n: int, start: int) -> list[int]:
    """``n`` increasing IDs with gaps; ~0.5% (at least 3) of them 2**36 and above."""
    if n == 0:
        return []
    gaps = rng.choices((1, 2, 3, 7, 50, 1000), weights=(70, 12, 8, 6, 3, 1), k=n)
    ids = list(accumulate(gaps, initial=start))[1:]
    k = min(n, max(3, n // 200))
    highs = list(accumulate(rng.choices((1, 2, 977, 1 << 20), k=k - 1), initial=HIGH_ID))
    highs[-1] = rng.randrange(1 << 63, MAX_ID + 1) if k > 2 else highs[-1]
    for pos, high in zip(sorted(rng.sample(range(n), k)), highs, strict=True):
        ids[pos] = high
    return ids


@dataclass
class LegacyData:
    """Rows per legacy table, columns in ``LEGACY_COLUMNS`` order.

    ``created_at`` (always the last column) is unix seconds, ``None`` or ``ZERO``.
    ``hot_boards`` are the IDs of the most followed boards (never made bad).
    """

    tables: dict[str, list[list]] = field(default_factory=lambda: {t: [] for t in LEGACY_TABLES})
    hot_boards: set[int] = field(default_factory=set)



class CleanBuilder:
    """Builds the clean data set table by table; ``corrupt.Corrupter`` then adds the bad rows."""

    def __init__(self, users: int, seed: int) -> None:
        self.n = users
        self.rng = random.Random(seed)
        self.data = LegacyData()
        self.t = self.data.tables
        self.phrases = _phrases(self.rng)

    def run(self) -> LegacyData:
        """Every table, parents before children."""
        for step in (self.users, self.boards, self.pins, self.follows, self.comments_and_likes):
            step()
        return self.data

    def _text(self) -> str:
        """A pin, board or comment text: one to three phrases."""
        rng, phrases = self.rng, self.phrases
        if rng.random() < 0.5:
            return phrases[rng.getrandbits(12)]
        return " ".join([phrases[rng.getrandbits(12)] for _ in range(2 + rng.getrandbits(1))])

    def _assign_ids(self, rows: list[list], start: int) -> None:
        """Order rows by creation time and give them sparse increasing IDs."""
        rows.sort(key=itemgetter(-1))
        for row, new_id in zip(rows, _sparse_ids(self.rng, len(rows), start), strict=True):
            row[0] = new_id

    def users(self) -> None:
        """Users: sign-ups growing over four years, in same-second bursts now and then."""
        rng, n = self.rng, self.n
        times = sorted(EPOCH + int(4 * 365 * DAY * rng.random() ** 0.5) for _ in range(n))
        shared = [f"{rng.choice(HANDLES)}.family@{rng.choice(DOMAINS)}" for _ in range(n // 80 + 1)]
        burst = 0
        for i in range(n):
            if burst:
                times[i], burst = times[i - 1], burst - 1
            elif i and rng.random() < 0.02:
                burst = rng.randint(2, 40)
            self.t["users"].append([0, f"{rng.choice(HANDLES)}{rng.choice('_.')}{i}",
                                    self._email(i, shared), self._full_name(), times[i]])
        self._assign_ids(self.t["users"], 1000)

    def _email(self, i: int, shared: list[str]) -> str | None:
        """Mostly unique, mixed case; some NULL; some shared by several users."""
        r = self.rng.random()
        if r < 0.08:
            return None
        if r < 0.14:
            email = self.rng.choice(shared)
            return email.upper() if self.rng.random() < 0.3 else email
        email = f"{self.rng.choice(HANDLES)}{i}@{self.rng.choice(DOMAINS)}"
        return email.title() if self.rng.random() < 0.1 else email

    def _full_name(self) -> str | None:
        """A person's name; some NULL, some with emoji, quotes, backslashes, newlines, NUL."""
        r = self.rng.random()
        if r < 0.07:
            return None
        if r < 0.13:
            return self.rng.choice(ODD_NAMES)
        name = f"{self.rng.choice(FIRST)} {self.rng.choice(LAST)}"
        return name + " " + self.rng.choice(WORDS[19:23]) if r > 0.95 else name

    def boards(self) -> None:
        """Power-law boards per user, often several in the same second; ~4% group boards."""
        rng, users = self.rng, self.t["users"]
        self.owned: list[list[list]] = []
        for u in users:
            mine, t = [], u[4] + int(rng.expovariate(1 / (20 * DAY)))
            count = _lomax(rng, 3.0, 200)
            spacing = min(30 * DAY, 600 * DAY // max(count, 1))
            for _ in range(count):
                desc = self._text() if rng.random() < 0.5 else None
                name = rng.choice(TOPICS) if rng.random() > 0.02 else None
                mine.append([0, u[0], name, desc, t])
                if rng.random() > 0.4:
                    t += int(rng.expovariate(1 / spacing))
            self.owned.append(mine)
            self.t["boards"].extend(mine)
        self._assign_ids(self.t["boards"], 5000)
        self.groups: dict[int, list[list]] = {}
        for board in self.t["boards"]:
            if rng.random() < 0.04:
                for ui in rng.sample(range(len(users)), min(len(users), rng.randint(2, 8))):
                    self.groups.setdefault(ui, []).append(board)

    def _after(self, base: int, last: int, mean_days: float, burst: float = 0.5) -> int:
        """A time after ``base``; often ``last`` again when that is late enough (a burst)."""
        if last >= base and self.rng.random() < burst:
            return last
        return base + int(self.rng.expovariate(1 / (mean_days * DAY)))

    def _pin(self, u: list, board: list, last: int) -> list:
        """One pin of ``u`` on ``board``: text, maybe a link (rarely ~2,000 chars), an image.

        One 64-bit draw decides most fields: pins are the bulk, so this is the hot loop.
        """
        bits = self.rng.getrandbits(64)
        link = None if bits % 5 == 0 else (
            f"https://www.example.com/{WORDS[bits % 18]}/{bits >> 44}"
            + ("x" * 1990 if (bits >> 20) % 1000 == 0 else ""))
        details = self._text() if (bits >> 30) % 10 else (None, "")[(bits >> 34) & 1]
        image = None if (bits >> 36) % 50 == 0 else f"https://i.example.net/{bits:016x}.jpg"
        return [0, u[0], board[0], details, link, image,
                self._after(max(board[4], u[4]), last, 60)]

    def pins(self) -> None:
        """The bulk: power-law pins per user on own boards or group boards, in sessions."""
        rng, pins = self.rng, self.t["pins"]
        for ui, u in enumerate(self.t["users"]):
            own, group, last = self.owned[ui], self.groups.get(ui, ()), 0
            for _ in range(_lomax(rng, 23.0, 3000) if own or group else 0):
                pool = group if (group and (not own or rng.random() < 0.3)) else own
                pins.append(self._pin(u, pool[int(len(pool) * rng.random() ** 2)], last))
                last = pins[-1][-1]
        self._assign_ids(pins, 10_000)

    def _edges(self, table: str, targets: list[list], cum: list[float], mean: float,
               days: float) -> None:
        """Follows or likes: a power-law count per user of Zipf-popular targets."""
        rng = self.rng
        for u in self.t["users"]:
            seen, last = set(), 0
            for target in rng.choices(targets, cum_weights=cum, k=_lomax(rng, mean, 400)):
                if target[0] not in seen:
                    seen.add(target[0])
                    last = self._after(max(target[-1], u[4]), last, days)
                    self.t[table].append([u[0], target[0], last])

    def follows(self) -> None:
        """Follows of Zipf-popular boards: at 5,000 users the top boards get thousands."""
        boards = self.t["boards"]
        if boards:
            cum, ranks = _zipf(self.rng, len(boards), 1.1)
            hot = max(1, len(boards) // 500)
            self.data.hot_boards = {b[0] for b, r in zip(boards, ranks, strict=True) if r <= hot}
            self._edges("follows", boards, cum, 9.0, 90)

    def comments_and_likes(self) -> None:
        """Comments and likes on Zipf-popular pins by random users."""
        rng, users, pins = self.rng, self.t["users"], self.t["pins"]
        if not pins:
            return
        cum, _ = _zipf(rng, len(pins), 0.9)
        last = 0
        for pin in rng.choices(pins, cum_weights=cum, k=4 * self.n):
            u = users[rng.randrange(len(users))]
            last = self._after(max(pin[-1], u[4]), last, 10, burst=0.2)
            body = self._text() if rng.random() > 0.02 else None
            self.t["comments"].append([0, pin[0], u[0], body, last])
        self._assign_ids(self.t["comments"], 1)
        self._edges("likes", pins, cum, 5.0, 20)

