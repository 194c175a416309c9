"""Host-side tools (import name ``speakd_tools``): checkpoint, export, calibrate, precompute, bench."""
