/* ua_probe: a libiscsi initiator that reports the unit attentions its I_T nexus is owed.
 * Used by test/tests/live_changes/acceptance.rs (issue 26: "libiscsi observes each unit
 * attention"); libiscsi's command-line utilities clear unit attentions without showing them.
 *
 * Usage: ua_probe iscsi://HOST:PORT/TARGET/0
 * Logs in (libiscsi's full connect consumes the power-on unit attention of LUN 0), prints
 * "ready", then for each LUN number read from stdin sends TEST UNIT READY to that LUN until
 * it is GOOD, printing "ua KEY ASC ASCQ" (hex) for each unit attention met, then "good";
 * any other answer prints "error ..." and ends the probe with status 1. */
#include <stdio.h>
#include <stdlib.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ua_probe iscsi://HOST:PORT/TARGET/LUN\n");
        return 2;
    }
    struct iscsi_context *iscsi = iscsi_create_context("iqn.2024-01.test:libiscsi-ua-probe");
    if (iscsi == NULL) {
        fprintf(stderr, "cannot create a libiscsi context\n");
        return 1;
    }
    struct iscsi_url *url = iscsi_parse_full_url(iscsi, argv[1]);
    if (url == NULL) {
        fprintf(stderr, "bad URL %s: %s\n", argv[1], iscsi_get_error(iscsi));
        return 2;
    }
    iscsi_set_targetname(iscsi, url->target);
    iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
    iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
    if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
        printf("error login: %s\n", iscsi_get_error(iscsi));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    int lun;
    while (scanf("%d", &lun) == 1) {
        for (int i = 0; i < 16; i++) {
            struct scsi_task *task = iscsi_testunitready_sync(iscsi, lun);
            if (task == NULL) {
                printf("error TEST UNIT READY: %s\n", iscsi_get_error(iscsi));
                return 1;
            }
            if (task->status == SCSI_STATUS_GOOD) {
                scsi_free_scsi_task(task);
                printf("good\n");
                break;
            }
            if (task->status == SCSI_STATUS_CHECK_CONDITION && task->sense.key == SCSI_SENSE_UNIT_ATTENTION) {
                printf("ua %x %x %x\n", task->sense.key, (task->sense.ascq >> 8) & 0xff, task->sense.ascq & 0xff);
                scsi_free_scsi_task(task);
                continue;
            }
            printf("error status %#x sense %x/%x\n", task->status, task->sense.key, task->sense.ascq);
            scsi_free_scsi_task(task);
            return 1;
        }
        fflush(stdout);
    }
    iscsi_logout_sync(iscsi);
    iscsi_destroy_url(url);
    iscsi_destroy_context(iscsi);
    return 0;
}
