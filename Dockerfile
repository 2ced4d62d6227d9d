# sluice in a container: the static binary and nothing else. Build it with
# `make docker`, which builds bin/sluice-static (CGO_ENABLED=0) first: no
# image is pulled (FROM scratch), so this builds offline.
FROM scratch
COPY bin/sluice-static /sluice
# Not root: a numeric user id (scratch has no /etc/passwd).
USER 65532:65532
# gRPC (checks, peers, Envoy RLS), HTTP (/v1/check, /metrics, /healthz,
# /readyz), gossip (TCP and UDP).
EXPOSE 7070/tcp 7080/tcp 7946/tcp 7946/udp
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/sluice", "healthcheck", "--addr", "127.0.0.1:7070", "--timeout", "2s"]
ENTRYPOINT ["/sluice"]
CMD ["serve", "--grpc-addr", "0.0.0.0:7070", "--http-addr", "0.0.0.0:7080", "--gossip-addr", "0.0.0.0:7946"]
