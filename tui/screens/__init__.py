"""The app's screens: wizard, dashboard, summary, records browser and the small modal dialogs."""
