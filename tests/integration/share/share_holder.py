"""A share-group member that acquires records and then holds them without acknowledging, until killed:
`python share_holder.py BOOTSTRAP GROUP TOPIC`. Prints `held <offset> <offset> ...` once it holds some."""

from __future__ import annotations

import sys
import time

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.share import KafkaShareConsumer


def main(bootstrap: str, group: str, topic: str) -> None:
    consumer = KafkaShareConsumer(KafkaConfig(bootstrap=bootstrap), group_id=group)
    consumer.subscribe([topic])
    while True:
        batch = consumer.poll(0.5)
        if batch:
            print("held", *(m.offset for m in batch), flush=True)
            while True:  # hold them: the test SIGKILLs this process
                time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
