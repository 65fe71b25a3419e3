"""The Supervisor: finds attempts whose CompleteBy has passed and turns them
back into progress (retry), a long wait (long retry) or an Error with an alert."""
