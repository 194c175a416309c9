"""Fleet tools over the boards' MQTT broker: ``speakd-tools pack publish`` rolls a prompt pack out
to every board acting on a site (the board's side is speakd/mqtt/packs.py) and
``speakd-tools fleet status`` reads every board's retained state. docs/fleet.md is the workflow."""
