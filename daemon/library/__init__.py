"""speakd as a library: in-process synthesis, `speakd synth`, the socket client."""
