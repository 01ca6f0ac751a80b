"""The daemon around the parts: `steprec serve`, its settings, auth, metrics and logs; a recorder as a
child process (demo, tests, benchmarks); `steprec demo`."""
