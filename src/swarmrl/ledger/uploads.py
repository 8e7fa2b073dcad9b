"""The workers' uploads as the ledger counts them: files, samples, files trained."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmrl.ledger.models import Submission


@dataclass(frozen=True)
class Uploads:
    files: int  # rollout files the orchestrator accepted for upload
    samples: int  # the samples in them
    files_trained: int  # those the trainer trained on


def upload_totals(session: Session) -> Uploads:
    files, samples, trained = session.execute(
        select(
            func.count(Submission.file_hash),
            func.coalesce(func.sum(Submission.num_samples), 0),
            func.count(Submission.trained_step),
        )
    ).one()
    return Uploads(files=files, samples=samples, files_trained=trained)
