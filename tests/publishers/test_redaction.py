"""publishers.redaction: passwords never reach a message, whatever they hold."""

from __future__ import annotations

import pytest

from publishers.redaction import mask_passwords, scrub, scrub_url, url_for_display, url_secrets

TRICKY = ["hunter2", "pa/ss", "p@ss", "pa;ss", "pa}ss", "p%40ss", "a/b@c;d}e%f"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://alice:hunter2@h:6380/1", "rediss://alice:***@h:6380/1"),
        ("redis://alice@h/0", "redis://alice@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("unix://alice:hunter2@/tmp/redis.sock?db=2", "unix://alice:***@/tmp/redis.sock?db=2"),
        ("redis://h/0?password=hunter2&db=1", "redis://h/0?password=***&db=1"),
    ],
)
def test_url_for_display(url: str, expected: str) -> None:
    assert url_for_display(url) == expected


@pytest.mark.parametrize("password", TRICKY)
def test_url_passwords_with_special_characters(password: str) -> None:
    url = f"redis://alice:{password}@h:6379/0"
    shown = url_for_display(url)
    assert password not in shown
    assert shown.startswith("redis://alice:***@")
    assert password in url_secrets(url)
    message = scrub_url(f"cannot connect to {url}: auth {password} refused", url)
    assert password not in message


@pytest.mark.parametrize("password", TRICKY)
def test_mask_passwords_in_urls_and_queries(password: str) -> None:
    assert password not in mask_passwords(f"url redis://u:{password}@h/0 failed")
    masked = mask_passwords(f"redis://h/0?db=1&password={password}&x=1")
    assert masked == "redis://h/0?db=1&password=***&x=1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DRIVER=x;UID=sa;PWD=hunter2;Encrypt=no", "DRIVER=x;UID=sa;PWD=***;Encrypt=no"),
        ("UID=sa;PWD={pa;ss}}word};Encrypt=no", "UID=sa;PWD=***;Encrypt=no"),
        ("uid=sa;pwd = {a/b@c;d}}e%f}", "uid=sa;pwd = ***"),
        ("host=h user=u password=hunter2 dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password='pa ss\\'wo;rd' dbname=d", "host=h password=*** dbname=d"),
        ("redis://h/0?password=hunter2&db=1", "redis://h/0?password=***&db=1"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_mask_passwords_in_connection_strings(text: str, expected: str) -> None:
    assert mask_passwords(text) == expected


def test_scrub_replaces_each_secret_longest_first() -> None:
    assert scrub("a pa;ss and pa;ss}x", ["pa;ss", "pa;ss}x"]) == "a *** and ***"
    assert scrub("nothing", ["", "zz"]) == "nothing"
