"""Deployment tooling: what ships (package), the functions the app indexes
(app_functions), the checks before `azd provision` (preflight), the keys
created in the deployment's vault after it (keys) and the smoke test after
`azd deploy` (smoke). See docs/deploying.md and infra/README.md."""
