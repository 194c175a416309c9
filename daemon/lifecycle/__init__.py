"""The daemon's life: start-up, systemd notifications, reload, shutdown, and `speakd doctor`."""
