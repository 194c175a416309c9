"""Host-side tools (import ``speakd_tools``): checkpoint, export, calibrate, precompute, bench."""
