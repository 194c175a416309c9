"""``speakd-tools soak``: every front-end at once, for minutes or hours, with faults on a
schedule, counting every request's terminal event (docs/reliability.md, "Soak")."""
