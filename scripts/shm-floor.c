/*
 * The floor of a `shm` reliable-datagram round trip for a given fabric
 * set-up: two processes (a fork), one endpoint each, 64-byte messages,
 * busy polling, nothing between a completion and the next post. It tells
 * what libfabric itself costs with the set-up netio-libfabric uses (tagged
 * messages, one completion queue for both directions, FI_THREAD_SAFE,
 * FI_ORDER_SAS, a read of up to 64 completions, the reply sent before the
 * receive is posted again) against the set-up of `fi_pingpong -e rdm`, so
 * that the rest of a netio round trip can be put down to netio's own path.
 *
 *   cc -O2 -o /tmp/shm-floor scripts/shm-floor.c -lfabric
 *   /tmp/shm-floor VARIANT [ROUND_TRIPS]      (default 200000, after 1000)
 *
 * Each side answers a message the same way (the client with its next
 * ping). VARIANT is a sum of: 1 tagged messages (fi_tinject/fi_trecv, else
 * fi_inject/fi_recv), 2 one completion queue for sends and receives (else
 * one each), 4 the reply sent before the receive is posted again (else
 * after, as fi_pingpong does), 8 FI_THREAD_SAFE asked for, 16 FI_ORDER_SAS
 * asked for, 32 completion reads of up to 64 entries (else 1). 0 is
 * fi_pingpong's set-up, 63 netio-libfabric's. Prints the mean round trip.
 * Needs libfabric-dev (>= 1.17).
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                  \
	do {                                                                   \
		int rc_ = (int)(x);                                            \
		if (rc_) {                                                     \
			fprintf(stderr, "%s: %d %s\n", #x, rc_,                \
				fi_strerror(-rc_));                            \
			exit(1);                                               \
		}                                                              \
	} while (0)

enum { TAGGED = 1, ONE_CQ = 2, REPLY_FIRST = 4, THREAD_SAFE = 8, SAS = 16, READ_64 = 32 };
enum { WARMUP = 1000, TAG = 7 };

static int variant;

struct side {
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_cq *tx_cq, *rx_cq;
	struct fid_av *av;
	fi_addr_t peer;
	char rx_buf[4096];
	char tx_buf[64];
	struct fi_context2 rx_ctx;
	char name[256];
	size_t name_len;
};

static void open_side(struct side *s, int child)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = (variant & TAGGED) ? (FI_MSG | FI_TAGGED) : FI_MSG;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR |
				      FI_MR_ALLOCATED | FI_MR_PROV_KEY |
				      FI_MR_ENDPOINT;
	if (variant & THREAD_SAFE)
		hints->domain_attr->threading = FI_THREAD_SAFE;
	if (variant & SAS) {
		hints->tx_attr->msg_order = FI_ORDER_SAS;
		hints->rx_attr->msg_order = FI_ORDER_SAS;
	}
	hints->fabric_attr->prov_name = strdup("shm");
	CK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	CK(fi_fabric(info->fabric_attr, &s->fabric, NULL));
	CK(fi_domain(s->fabric, info, &s->domain, NULL));
	struct fi_cq_attr cq_attr = {
		.size = 1024,
		.format = (variant & TAGGED) ? FI_CQ_FORMAT_TAGGED
					     : FI_CQ_FORMAT_CONTEXT,
		.wait_obj = FI_WAIT_NONE,
	};
	CK(fi_cq_open(s->domain, &cq_attr, &s->tx_cq, NULL));
	if (variant & ONE_CQ)
		s->rx_cq = s->tx_cq;
	else
		CK(fi_cq_open(s->domain, &cq_attr, &s->rx_cq, NULL));
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
	CK(fi_endpoint(s->domain, info, &s->ep, NULL));
	char name[64];
	snprintf(name, sizeof name, "fi_shm://shm-floor-%d-%d", (int)getpid(),
		 child);
	CK(fi_setname(&s->ep->fid, name, strlen(name) + 1));
	CK(fi_ep_bind(s->ep, &s->av->fid, 0));
	if (variant & ONE_CQ) {
		CK(fi_ep_bind(s->ep, &s->tx_cq->fid, FI_TRANSMIT | FI_RECV));
	} else {
		CK(fi_ep_bind(s->ep, &s->tx_cq->fid, FI_TRANSMIT));
		CK(fi_ep_bind(s->ep, &s->rx_cq->fid, FI_RECV));
	}
	CK(fi_enable(s->ep));
	s->name_len = sizeof s->name;
	CK(fi_getname(&s->ep->fid, s->name, &s->name_len));
	fi_freeinfo(hints);
	fi_freeinfo(info);
}

static void post_rx(struct side *s)
{
	ssize_t rc;
	do {
		rc = (variant & TAGGED)
			     ? fi_trecv(s->ep, s->rx_buf, sizeof s->rx_buf, NULL,
					FI_ADDR_UNSPEC, TAG, 0, &s->rx_ctx)
			     : fi_recv(s->ep, s->rx_buf, sizeof s->rx_buf, NULL,
				       FI_ADDR_UNSPEC, &s->rx_ctx);
	} while (rc == -FI_EAGAIN);
	CK(rc);
}

static void wait_rx(struct side *s)
{
	struct fi_cq_tagged_entry e[64];
	for (;;) {
		ssize_t n = fi_cq_read(s->rx_cq, e, (variant & READ_64) ? 64 : 1);
		if (n > 0 && e[0].op_context == &s->rx_ctx)
			return;
		if (n < 0 && n != -FI_EAGAIN) {
			fprintf(stderr, "fi_cq_read: %zd\n", n);
			exit(1);
		}
	}
}

static void tx(struct side *s)
{
	ssize_t rc;
	do {
		rc = (variant & TAGGED)
			     ? fi_tinject(s->ep, s->tx_buf, sizeof s->tx_buf,
					  s->peer, TAG)
			     : fi_inject(s->ep, s->tx_buf, sizeof s->tx_buf,
					 s->peer);
		if (rc == -FI_EAGAIN) {
			struct fi_cq_tagged_entry e;
			(void)fi_cq_read(s->tx_cq, &e, 1);
		}
	} while (rc == -FI_EAGAIN);
	CK(rc);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s VARIANT [ROUND_TRIPS]\n", argv[0]);
		return 2;
	}
	variant = atoi(argv[1]);
	long n = argc > 2 ? atol(argv[2]) : 200000;
	int to_child[2], to_parent[2];
	if (pipe(to_child) || pipe(to_parent))
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	static struct side s;
	open_side(&s, pid == 0);
	char peer[256];
	int in = pid == 0 ? to_child[0] : to_parent[0];
	int out = pid == 0 ? to_parent[1] : to_child[1];
	if (write(out, s.name, s.name_len) != (ssize_t)s.name_len ||
	    read(in, peer, s.name_len) != (ssize_t)s.name_len)
		return 1;
	CK(fi_av_insert(s.av, peer, 1, &s.peer, 0, NULL) != 1);
	post_rx(&s);
	char c = 0;
	/* Both receives are posted before the first message. */
	if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1)
		return 1;
	if (pid == 0) {
		for (long i = 0; i < n + WARMUP; i++) {
			wait_rx(&s);
			if (variant & REPLY_FIRST) {
				tx(&s);
				post_rx(&s);
			} else {
				post_rx(&s);
				tx(&s);
			}
		}
		_exit(0);
	}
	/* The client: a ping, then each reply answered as the variant says
	 * (the server does the same with each ping). */
	long total = n + WARMUP;
	struct timespec a = { 0 }, b;
	tx(&s);
	for (long i = 0; i < total; i++) {
		if (i == WARMUP)
			clock_gettime(CLOCK_MONOTONIC, &a);
		wait_rx(&s);
		int last = i + 1 == total;
		if (variant & REPLY_FIRST) {
			if (!last)
				tx(&s);
			post_rx(&s);
		} else {
			post_rx(&s);
			if (!last)
				tx(&s);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("variant %2d: %.3f us per round trip (%ld round trips)\n",
	       variant, ns / 1e3 / n, n);
	waitpid(pid, NULL, 0);
	return 0;
}
