"""Files the official emulators (docker-compose.yml) need, generated from the
project's own definitions so the two stacks cannot drift apart."""
