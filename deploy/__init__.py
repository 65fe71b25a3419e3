"""Deployment tooling: what ships (package), the functions the app indexes
(app_functions), the checks before `azd provision` (preflight) and the smoke
test after `azd deploy` (smoke). See infra/README.md, "A first deployment"."""
