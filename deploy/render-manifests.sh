#!/bin/sh
# Prints deploy/kubernetes/sluice.yaml: the Helm chart deploy/helm/sluice
# rendered as plain manifests (make k8s-manifests writes it; the deploy
# tests fail when the file differs from a fresh render). HELM names the
# helm binary (default: helm on PATH; make helm-tools installs the version
# the file was made with).
set -eu
cd "$(dirname "$0")/.."
HELM=${HELM:-helm}
cat <<'HEADER'
# sluice on Kubernetes as plain manifests, GENERATED from the Helm chart
# deploy/helm/sluice by `make k8s-manifests`: do not edit (change the chart or
# deploy/render-manifests.sh). docs/kubernetes.md explains them.
#
# The chart's defaults (secured: TLS, mutual TLS for clients, encrypted
# gossip; readiness on HTTPS /readyz; a PodDisruptionBudget and a
# NetworkPolicy), in namespace sluice, with the limits of
# examples/limits.yaml and the Envoy rules of examples/rls/edge.yaml.
# Before applying:
#   - replace the image registry.invalid/sluice:dev (a name that resolves
#     nowhere) with yours (make docker, then push), e.g. with kustomize's
#     images: or sed;
#   - create the Secrets sluice-ca (ca.pem, ca-key.pem) and sluice-gossip
#     (gossip.keys) with sluice's own commands (docs/kubernetes.md).
HEADER
"$HELM" template sluice deploy/helm/sluice --namespace sluice \
  --set namespace.create=true \
  --set image.repository=registry.invalid/sluice --set image.tag=dev \
  --set-file limits=examples/limits.yaml \
  --set-file rls.rules.edge=examples/rls/edge.yaml
